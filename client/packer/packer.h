// The packer turns gradients into the datagrams a worker pushes. In one pass over each tensor it
// computes every chunk's magnitude and class (common/classes/chunk_magnitude.h) and writes each
// chunk's packet: the wire header, then the payload in the chosen encoding. The CPU packer is the
// reference; the CUDA packer reads tensors straight from device memory and produces the same
// bytes. The client's data path classifies and encodes every push through a packer.
//
// Threading: a Packer is used by one thread at a time. Pack blocks until every output is written
// (for the CUDA packer: until the device has finished) and never aborts: bad input is a Status.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/hd.h"
#include "common/classes/chunk_magnitude.h"
#include "common/classes/class_policy.h"
#include "common/wire/header.h"
#include "common/wire/payload_encoding.h"

namespace dlcp {

// The element type of the tensors being packed (what a framework stores), not the wire encoding.
enum class ElemType : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };
DLCP_HD inline uint32_t ElemWidth(ElemType t) { return t == ElemType::kF32 ? 4 : 2; }

struct PackTensor {
  uint64_t offset = 0;  // its first element in PackInput::data
  uint32_t elems = 0;
  uint32_t key = 0;
  uint32_t round = 0;
  uint32_t layer = 0;   // position from the input, for the class policy
  uint32_t epoch = 0;   // the epoch its packets carry
  double loss_bound = -1;  // its round's ε (TensorInfo::loss_bound)
};

struct PackInput {
  // Host memory for the CPU packer; device memory for the CUDA packer.
  const void* data = nullptr;
  ElemType type = ElemType::kF32;
  std::vector<PackTensor> tensors;
  uint32_t chunk_elems = 0;  // the job's chunk_bytes / 4
  uint32_t job = 0;
  uint32_t rank = 0;
  uint32_t num_layers = 0;
  wire::Encoding encoding = wire::Encoding::kF32;
  // false: magnitudes and classes only (the data path sends float32 straight from the tensor).
  bool write_packets = true;
};

// Where each tensor's chunks and packets go in the outputs. Chunk c of tensor t is entry
// first_chunk[t] + c of the per-chunk outputs. Packets are dense: packet i of tensor t starts at
// packet_offset[t] + i * stride, and only a tensor's last chunk may be shorter.
struct PackLayout {
  std::vector<uint32_t> first_chunk;     // tensors + 1 entries; the last is the chunk total
  std::vector<uint64_t> packet_offset;   // tensors + 1 entries; the last is the buffer's size
  std::vector<ClassTiers> tiers;         // per tensor
  uint64_t stride = 0;                   // bytes of a full chunk's packet
  uint32_t chunks() const { return first_chunk.back(); }
  uint64_t packet_bytes() const { return packet_offset.back(); }
};

// Checks the input (sizes, chunk geometry, the policy) and lays out the outputs.
absl::StatusOr<PackLayout> PlanPack(const PackInput& in, const ClassPolicyOptions& policy);

struct PackOutput {
  std::vector<double> magnitudes;  // per chunk: the sum of squares (chunk_magnitude.h)
  std::vector<uint8_t> classes;    // per chunk
  // write_packets: PackLayout::packet_bytes() bytes, provided by the caller. Host memory for the
  // CPU packer. For the CUDA packer, device memory or pinned host memory (cudaHostAlloc), which
  // the kernel writes directly; other host memory gets a copy of packets staged on the device.
  uint8_t* packets = nullptr;
};

class Packer {
 public:
  virtual ~Packer() = default;
  virtual const char* name() const = 0;
  virtual absl::Status Pack(const PackInput& in, PackOutput* out) = 0;
};

struct PackerOptions {
  enum class Device { kAuto, kCpu, kCuda };
  // kAuto: CUDA when the build has it and a device answers, otherwise the CPU.
  Device device = Device::kAuto;
  int cuda_device = 0;
  ClassPolicyOptions policy;
};

absl::StatusOr<std::unique_ptr<Packer>> CreatePacker(const PackerOptions& options);

// OK when this process can use a CUDA device: the build has CUDA and cudaGetDeviceCount finds
// one. Otherwise says why (a build without CUDA; on a machine without a driver the runtime
// answers error 35, "driver version is insufficient").
absl::Status CudaPackerAvailable();

// Copies between CUDA device memory and float32 host memory. They run on a stream that waits for
// no other, and block until the copy is done: whatever produces `device`'s values must be done
// first. UNAVAILABLE without CUDA.
//
// StoreToDevice writes `n` float32 values into `device` (on CUDA device `device_index`) as `type`,
// rounding to nearest even for the 16-bit types.
absl::Status StoreToDevice(const float* values, uint64_t n, ElemType type, void* device, int device_index);
// LoadFromDevice reads `n` values of `type` from `device` into `values`, exactly.
absl::Status LoadFromDevice(const void* device, uint64_t n, ElemType type, float* values, int device_index);

// Pins `bytes` of host memory at `p` (page-locked, for every device), so that a copy between it
// and a device is one DMA rather than one through the runtime's own staging buffers. Unpin it
// before it is unmapped.
absl::Status PinHostMemory(void* p, uint64_t bytes, int device_index);
absl::Status UnpinHostMemory(void* p);

}  // namespace dlcp
