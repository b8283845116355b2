#include "client/packer/cuda/cuda_packer.h"

#include <cuda_runtime.h>

#include <cub/device/device_segmented_radix_sort.cuh>

#include "absl/strings/str_cat.h"
#include "common/policy/chunk_magnitude.h"
#include "common/wire/header_layout.h"
#include "common/wire/payload_encoding.h"

namespace dlcp {
namespace {

// What a block needs about its tensor; one entry per tensor, on the device.
struct DeviceTensor {
  uint64_t offset;         // first element in the input
  uint64_t packet_offset;  // first packet byte
  uint32_t elems, key, round, epoch;
  uint32_t first_chunk;
  ClassTiers tiers;
};

struct Args {
  const void* data;
  ElemType type;
  const DeviceTensor* tensors;
  const uint32_t* first_chunk;  // tensors + 1 entries
  uint32_t num_tensors;
  uint32_t chunk_elems;
  wire::Encoding encoding;
  uint32_t job, rank;
  uint64_t stride;
  uint8_t* packets;  // nullptr: no packets
};

__device__ uint32_t TensorOf(const Args& a, uint32_t chunk) {
  uint32_t lo = 0, hi = a.num_tensors;  // first_chunk[lo] <= chunk < first_chunk[hi]
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    if (a.first_chunk[mid] <= chunk) lo = mid; else hi = mid;
  }
  return lo;
}

// Elements of the chunk that starts at element `begin` of tensor t (only the last is short).
__device__ uint32_t ChunkElems(const Args& a, const DeviceTensor& t, uint64_t begin) {
  const uint64_t rest = t.elems - begin;
  return rest < a.chunk_elems ? static_cast<uint32_t>(rest) : a.chunk_elems;
}

__device__ float LoadInput(const Args& a, uint64_t i) {
  switch (a.type) {
    case ElemType::kF16: return wire::F16ToF32(static_cast<const uint16_t*>(a.data)[i]);
    case ElemType::kBF16: return wire::BF16ToF32(static_cast<const uint16_t*>(a.data)[i]);
    default: return static_cast<const float*>(a.data)[i];
  }
}

// Value i of a payload. The device is little-endian like the wire, so an aligned payload takes
// whole words; StoreValue's bytes are the same.
__device__ void StorePayload(uint8_t* payload, uint32_t i, wire::Encoding e, float v, bool aligned) {
  if (!aligned) return wire::StoreValue(payload, i, e, v);
  if (e == wire::Encoding::kF32) {
    reinterpret_cast<uint32_t*>(payload)[i] = wire::FloatBits(v);
  } else {
    reinterpret_cast<uint16_t*>(payload)[i] = e == wire::Encoding::kF16 ? wire::F32ToF16(v) : wire::F32ToBF16(v);
  }
}

// One block per chunk: magnitude (chunk_magnitude.h's lanes and fold) and payload.
__global__ void __launch_bounds__(kNormLanes) PackChunks(Args a, double* magnitudes, uint64_t* keys, uint32_t* index) {
  const uint32_t chunk = blockIdx.x;
  const DeviceTensor& t = a.tensors[TensorOf(a, chunk)];
  const uint32_t c = chunk - t.first_chunk;
  const uint64_t begin = static_cast<uint64_t>(c) * a.chunk_elems;
  const uint32_t n = ChunkElems(a, t, begin);
  uint8_t* payload = a.packets ? a.packets + t.packet_offset + c * a.stride + wire::kHeaderSize : nullptr;
  const bool aligned = payload && reinterpret_cast<uintptr_t>(payload) % wire::EncodingWidth(a.encoding) == 0;
  double lane = 0;
  for (uint32_t i = threadIdx.x; i < n; i += kNormLanes) {
    const float v = LoadInput(a, t.offset + begin + i);
    lane += static_cast<double>(v) * static_cast<double>(v);
    if (payload) StorePayload(payload, i, a.encoding, v, aligned);
  }
  __shared__ double lanes[kNormLanes];
  lanes[threadIdx.x] = lane;
  __syncthreads();
  // FoldLanes, one step per round: step s reads only lanes >= s, which it never writes.
  for (uint32_t s = kNormLanes / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) lanes[threadIdx.x] += lanes[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    magnitudes[chunk] = lanes[0];
    keys[chunk] = MagnitudeOrderKey(lanes[0]);
    index[chunk] = c;
  }
}

// One thread per position of the sorted order: the chunk there gets its rank's class and header.
__global__ void ClassesAndHeaders(Args a, uint32_t chunks, const uint32_t* sorted_index, uint8_t* classes) {
  const uint32_t p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= chunks) return;
  const DeviceTensor& t = a.tensors[TensorOf(a, p)];
  const uint32_t c = sorted_index[p];
  const uint8_t cls = ClassAtRank(p - t.first_chunk, t.tiers);
  classes[t.first_chunk + c] = cls;
  if (!a.packets) return;
  const uint64_t begin = static_cast<uint64_t>(c) * a.chunk_elems;
  wire::Header h;
  h.type = wire::MsgType::kPush;
  h.priority = cls;
  h.job = a.job;
  h.key = t.key;
  h.round = t.round;
  h.chunk = c;
  h.chunk_count = t.tiers.chunks;
  h.tensor_elems = t.elems;
  h.rank = static_cast<uint16_t>(a.rank);
  h.epoch = t.epoch;
  h.payload_len = ChunkElems(a, t, begin) * wire::EncodingWidth(a.encoding);
  h.encoding = static_cast<uint8_t>(a.encoding);
  wire::EncodeHeaderBytes(h, a.packets + t.packet_offset + c * a.stride);
}

absl::Status CudaError(const char* what, cudaError_t e) {
  return absl::InternalError(absl::StrCat(what, ": CUDA error ", static_cast<int>(e), " (", cudaGetErrorString(e), ")"));
}
#define DLCP_CUDA_RETURN(call)                                    \
  do {                                                            \
    const cudaError_t dlcp_e_ = (call);                           \
    if (dlcp_e_ != cudaSuccess) return CudaError(#call, dlcp_e_); \
  } while (0)

// A device buffer that only grows.
template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t count = 0;
  ~DeviceBuffer() { if (ptr) cudaFree(ptr); }
  absl::Status Reserve(size_t n) {
    if (n <= count) return absl::OkStatus();
    if (ptr) cudaFree(ptr);
    ptr = nullptr;
    count = 0;
    DLCP_CUDA_RETURN(cudaMalloc(&ptr, n * sizeof(T)));
    count = n;
    return absl::OkStatus();
  }
};

// Where `p` lives; device and managed memory count as the device's, pinned host memory as host.
absl::StatusOr<cudaMemoryType> MemoryOf(const void* p) {
  cudaPointerAttributes attr{};
  DLCP_CUDA_RETURN(cudaPointerGetAttributes(&attr, p));
  return attr.type == cudaMemoryTypeManaged ? cudaMemoryTypeDevice : attr.type;
}

class CudaPacker : public Packer {
 public:
  CudaPacker(int device, const ClassPolicyOptions& policy) : device_(device), policy_(policy) {}
  ~CudaPacker() override {
    if (stream_) cudaStreamDestroy(stream_);
  }
  const char* name() const override { return "cuda"; }

  absl::Status Pack(const PackInput& in, PackOutput* out) override {
    absl::StatusOr<PackLayout> layout = PlanPack(in, policy_);
    if (!layout.ok()) return layout.status();
    if (in.write_packets && out->packets == nullptr) return absl::InvalidArgumentError("pack: no packet buffer");
    DLCP_CUDA_RETURN(cudaSetDevice(device_));
    if (!stream_) DLCP_CUDA_RETURN(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    absl::StatusOr<cudaMemoryType> input = MemoryOf(in.data);
    if (!input.ok()) return input.status();
    if (*input != cudaMemoryTypeDevice) return absl::InvalidArgumentError("pack: the input must be CUDA device memory");
    uint8_t* packets = nullptr;  // where the kernels write
    bool stage = false;          // then copied to out->packets, ordinary host memory
    if (in.write_packets) {
      absl::StatusOr<cudaMemoryType> where = MemoryOf(out->packets);
      if (!where.ok()) return where.status();
      stage = *where == cudaMemoryTypeUnregistered;
      if (stage) {
        if (absl::Status s = staged_.Reserve(layout->packet_bytes()); !s.ok()) return s;
        packets = staged_.ptr;
      } else {
        packets = out->packets;
      }
    }
    const uint32_t chunks = layout->chunks();
    const uint32_t tensors = static_cast<uint32_t>(in.tensors.size());
    std::vector<DeviceTensor> table(tensors);
    for (uint32_t t = 0; t < tensors; ++t) {
      const PackTensor& pt = in.tensors[t];
      table[t] = DeviceTensor{pt.offset, layout->packet_offset[t], pt.elems, pt.key, pt.round, pt.epoch,
                              layout->first_chunk[t], layout->tiers[t]};
    }
    for (absl::Status s : {tensors_.Reserve(tensors), first_.Reserve(tensors + 1), magnitudes_.Reserve(chunks),
                           keys_.Reserve(chunks), sorted_keys_.Reserve(chunks), index_.Reserve(chunks),
                           sorted_index_.Reserve(chunks), classes_.Reserve(chunks)}) {
      if (!s.ok()) return s;
    }
    DLCP_CUDA_RETURN(cudaMemcpyAsync(tensors_.ptr, table.data(), tensors * sizeof(DeviceTensor),
                                     cudaMemcpyHostToDevice, stream_));
    DLCP_CUDA_RETURN(cudaMemcpyAsync(first_.ptr, layout->first_chunk.data(), (tensors + 1) * sizeof(uint32_t),
                                     cudaMemcpyHostToDevice, stream_));
    const Args a{in.data, in.type, tensors_.ptr, first_.ptr, tensors, in.chunk_elems, in.encoding,
                 in.job, in.rank, layout->stride, packets};
    PackChunks<<<chunks, kNormLanes, 0, stream_>>>(a, magnitudes_.ptr, keys_.ptr, index_.ptr);
    DLCP_CUDA_RETURN(cudaGetLastError());
    const uint32_t* order = index_.ptr;
    if (policy_.kind != ClassPolicyOptions::Kind::kUniform) {
      // Ascending on MagnitudeOrderKey, stable: largest magnitude first, lower index among equals.
      size_t temp = 0;
      DLCP_CUDA_RETURN(cub::DeviceSegmentedRadixSort::SortPairs(
          nullptr, temp, keys_.ptr, sorted_keys_.ptr, index_.ptr, sorted_index_.ptr, static_cast<int>(chunks),
          static_cast<int>(tensors), first_.ptr, first_.ptr + 1, 0, 64, stream_));
      // Never null: CUB reads a null scratch pointer as "tell me the size" and sorts nothing.
      if (absl::Status s = temp_.Reserve(temp > 0 ? temp : 1); !s.ok()) return s;
      DLCP_CUDA_RETURN(cub::DeviceSegmentedRadixSort::SortPairs(
          temp_.ptr, temp, keys_.ptr, sorted_keys_.ptr, index_.ptr, sorted_index_.ptr, static_cast<int>(chunks),
          static_cast<int>(tensors), first_.ptr, first_.ptr + 1, 0, 64, stream_));
      order = sorted_index_.ptr;
    }
    ClassesAndHeaders<<<(chunks + 255) / 256, 256, 0, stream_>>>(a, chunks, order, classes_.ptr);
    DLCP_CUDA_RETURN(cudaGetLastError());
    out->magnitudes.resize(chunks);
    out->classes.resize(chunks);
    DLCP_CUDA_RETURN(cudaMemcpyAsync(out->magnitudes.data(), magnitudes_.ptr, chunks * sizeof(double),
                                     cudaMemcpyDeviceToHost, stream_));
    DLCP_CUDA_RETURN(cudaMemcpyAsync(out->classes.data(), classes_.ptr, chunks, cudaMemcpyDeviceToHost, stream_));
    if (stage) {
      DLCP_CUDA_RETURN(cudaMemcpyAsync(out->packets, packets, layout->packet_bytes(), cudaMemcpyDeviceToHost, stream_));
    }
    DLCP_CUDA_RETURN(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

 private:
  int device_;
  ClassPolicyOptions policy_;
  cudaStream_t stream_ = nullptr;
  DeviceBuffer<DeviceTensor> tensors_;
  DeviceBuffer<uint32_t> first_, index_, sorted_index_;
  DeviceBuffer<double> magnitudes_;
  DeviceBuffer<uint64_t> keys_, sorted_keys_;
  DeviceBuffer<uint8_t> classes_, temp_, staged_;
};

}  // namespace

absl::Status CudaDeviceStatus() {
  int count = 0;  // the runtime leaves it unset when it fails
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    return absl::UnavailableError(absl::StrCat("no usable CUDA device: cudaGetDeviceCount returned error ",
                                               static_cast<int>(e), " (", cudaGetErrorString(e), ")"));
  }
  if (count <= 0) return absl::UnavailableError("no CUDA device");
  return absl::OkStatus();
}

absl::Status StoreToDevice(const float* values, uint64_t n, ElemType type, void* device, int device_index) {
  DLCP_CUDA_RETURN(cudaSetDevice(device_index));
  if (type == ElemType::kF32) {
    DLCP_CUDA_RETURN(cudaMemcpy(device, values, n * sizeof(float), cudaMemcpyHostToDevice));
    return absl::OkStatus();
  }
  // float16 / bfloat16 tensors hold exactly what those payload encodings hold.
  const wire::Encoding e = type == ElemType::kF16 ? wire::Encoding::kF16 : wire::Encoding::kBF16;
  std::vector<uint8_t> narrow(n * 2);
  for (uint64_t off = 0; off < n; off += 1u << 30) {
    const uint32_t count = static_cast<uint32_t>(n - off < (1u << 30) ? n - off : (1u << 30));
    wire::EncodeValues(values + off, count, e, narrow.data() + 2 * off);
  }
  DLCP_CUDA_RETURN(cudaMemcpy(device, narrow.data(), narrow.size(), cudaMemcpyHostToDevice));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Packer>> CreateCudaPacker(int device, const ClassPolicyOptions& policy) {
  if (absl::Status s = CudaDeviceStatus(); !s.ok()) return s;
  int count = 0;
  cudaGetDeviceCount(&count);
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", device, " does not exist (", count, " found)"));
  }
  if (absl::Status s = ValidateClassPolicy(policy); !s.ok()) return s;
  return std::make_unique<CudaPacker>(device, policy);
}

}  // namespace dlcp
