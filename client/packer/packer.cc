#include "client/packer/packer.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "client/packer/cpu/cpu_packer.h"
#include "common/base/build_config.h"
#if DLCP_WITH_CUDA
#include "client/packer/cuda/cuda_packer.h"
#endif

namespace dlcp {

absl::StatusOr<PackLayout> PlanPack(const PackInput& in, const ClassPolicyOptions& policy) {
  if (in.data == nullptr) return absl::InvalidArgumentError("pack: no input buffer");
  if (in.tensors.empty()) return absl::InvalidArgumentError("pack: no tensors");
  if (in.rank > std::numeric_limits<uint16_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("pack: rank ", in.rank, " exceeds 65535"));
  }
  if (static_cast<uint8_t>(in.encoding) >= wire::kNumEncodings) return absl::InvalidArgumentError("pack: bad encoding");
  if (static_cast<uint8_t>(in.type) > static_cast<uint8_t>(ElemType::kBF16)) {
    return absl::InvalidArgumentError("pack: bad element type");
  }
  const uint32_t width = wire::EncodingWidth(in.encoding);
  if (in.chunk_elems == 0 || static_cast<uint64_t>(in.chunk_elems) * width > wire::kMaxPayload) {
    return absl::InvalidArgumentError(
        absl::StrCat("pack: ", in.chunk_elems, " elements per chunk do not fit a datagram's payload"));
  }
  if (absl::Status s = ValidateClassPolicy(policy); !s.ok()) return s;
  PackLayout layout;
  layout.stride = wire::kHeaderSize + static_cast<uint64_t>(in.chunk_elems) * width;
  layout.first_chunk.push_back(0);
  layout.packet_offset.push_back(0);
  for (const PackTensor& t : in.tensors) {
    if (t.elems == 0) return absl::InvalidArgumentError(absl::StrCat("pack: tensor of key ", t.key, " is empty"));
    const wire::ChunkGeometry g{t.elems, in.chunk_elems};
    const uint32_t chunks = g.chunk_count();
    if (static_cast<uint64_t>(layout.first_chunk.back()) + chunks > std::numeric_limits<uint32_t>::max()) {
      return absl::InvalidArgumentError("pack: more than 2^32 - 1 chunks");
    }
    layout.tiers.push_back(TiersFor(policy, chunks, TensorInfo{t.layer, in.num_layers, t.loss_bound}));
    layout.first_chunk.push_back(layout.first_chunk.back() + chunks);
    const uint64_t bytes = (chunks - 1) * layout.stride + wire::kHeaderSize + static_cast<uint64_t>(g.elems(chunks - 1)) * width;
    layout.packet_offset.push_back(layout.packet_offset.back() + bytes);
  }
  return layout;
}

absl::Status CudaPackerAvailable() {
#if DLCP_WITH_CUDA
  return CudaDeviceStatus();
#else
  return absl::UnavailableError("this dlcp was built without CUDA (DLCP_WITH_CUDA=OFF)");
#endif
}

#if !DLCP_WITH_CUDA
absl::Status StoreToDevice(const float*, uint64_t, ElemType, void*, int) { return CudaPackerAvailable(); }
absl::Status LoadFromDevice(const void*, uint64_t, ElemType, float*, int) { return CudaPackerAvailable(); }
absl::Status PinHostMemory(void*, uint64_t, int) { return CudaPackerAvailable(); }
absl::Status UnpinHostMemory(void*) { return CudaPackerAvailable(); }
#endif

absl::StatusOr<std::unique_ptr<Packer>> CreatePacker(const PackerOptions& options) {
  if (options.device == PackerOptions::Device::kCpu) return CreateCpuPacker(options.policy);
  absl::Status cuda = CudaPackerAvailable();
  if (!cuda.ok()) {
    if (options.device == PackerOptions::Device::kCuda) return cuda;
    return CreateCpuPacker(options.policy);
  }
#if DLCP_WITH_CUDA
  return CreateCudaPacker(options.cuda_device, options.policy);
#else
  return cuda;
#endif
}

}  // namespace dlcp
