// Copies between CUDA device memory and the host for the client's data path (packer.h). They run
// on a stream of their own that does not wait for other streams, so a copy never waits for the
// trainer's compute stream: callers order it after the work that produced a tensor (an event) and
// read a result only once the copy returned.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <vector>

#include "client/packer/cuda/cuda_error.h"
#include "client/packer/packer.h"
#include "common/wire/payload_encoding.h"

namespace dlcp {
namespace {

constexpr int kMaxDevices = 64;

// The copy stream of `device`, made at its first copy; it lives as long as the process. Makes
// `device` the calling thread's current one, for the copy that follows.
absl::StatusOr<cudaStream_t> CopyStream(int device) {
  if (device < 0 || device >= kMaxDevices) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", device, " is out of range"));
  }
  static std::mutex mu;
  static std::array<cudaStream_t, kMaxDevices> streams{};
  std::lock_guard<std::mutex> lock(mu);
  DLCP_CUDA_RETURN(cudaSetDevice(device));
  if (streams[device] == nullptr) {
    DLCP_CUDA_RETURN(cudaStreamCreateWithFlags(&streams[device], cudaStreamNonBlocking));
  }
  return streams[device];
}

absl::Status Copy(void* to, const void* from, uint64_t bytes, cudaMemcpyKind kind, int device) {
  absl::StatusOr<cudaStream_t> stream = CopyStream(device);
  if (!stream.ok()) return stream.status();
  DLCP_CUDA_RETURN(cudaMemcpyAsync(to, from, bytes, kind, *stream));
  DLCP_CUDA_RETURN(cudaStreamSynchronize(*stream));
  return absl::OkStatus();
}

// float16 / bfloat16 tensors hold exactly what those payload encodings hold.
wire::Encoding NarrowEncoding(ElemType type) {
  return type == ElemType::kF16 ? wire::Encoding::kF16 : wire::Encoding::kBF16;
}

// EncodeValues and DecodeValues take counts below 2^32.
constexpr uint64_t kPiece = uint64_t{1} << 30;

std::vector<uint8_t>& NarrowBuffer(uint64_t bytes) {
  thread_local std::vector<uint8_t> buffer;  // kept: a stage copies a slot's worth per step
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer;
}

}  // namespace

absl::Status StoreToDevice(const float* values, uint64_t n, ElemType type, void* device, int device_index) {
  if (type == ElemType::kF32) return Copy(device, values, n * sizeof(float), cudaMemcpyHostToDevice, device_index);
  std::vector<uint8_t>& narrow = NarrowBuffer(n * 2);
  for (uint64_t off = 0; off < n; off += kPiece) {
    const uint32_t count = static_cast<uint32_t>(std::min(n - off, kPiece));
    wire::EncodeValues(values + off, count, NarrowEncoding(type), narrow.data() + 2 * off);
  }
  return Copy(device, narrow.data(), n * 2, cudaMemcpyHostToDevice, device_index);
}

absl::Status LoadFromDevice(const void* device, uint64_t n, ElemType type, float* values, int device_index) {
  if (type == ElemType::kF32) return Copy(values, device, n * sizeof(float), cudaMemcpyDeviceToHost, device_index);
  std::vector<uint8_t>& narrow = NarrowBuffer(n * 2);
  if (absl::Status s = Copy(narrow.data(), device, n * 2, cudaMemcpyDeviceToHost, device_index); !s.ok()) return s;
  for (uint64_t off = 0; off < n; off += kPiece) {
    const uint32_t count = static_cast<uint32_t>(std::min(n - off, kPiece));
    wire::DecodeValues(narrow.data() + 2 * off, count, NarrowEncoding(type), values + off);
  }
  return absl::OkStatus();
}

absl::Status PinHostMemory(void* p, uint64_t bytes, int device_index) {
  DLCP_CUDA_RETURN(cudaSetDevice(device_index));
  DLCP_CUDA_RETURN(cudaHostRegister(p, bytes, cudaHostRegisterPortable));
  return absl::OkStatus();
}

absl::Status UnpinHostMemory(void* p) {
  DLCP_CUDA_RETURN(cudaHostUnregister(p));
  return absl::OkStatus();
}

}  // namespace dlcp
