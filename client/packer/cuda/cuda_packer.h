// The CUDA packer: tensors in device memory, packets into device memory (for RDMA from a
// registered buffer) or pinned host memory. One block of kNormLanes threads per chunk reads each
// value once, folds its square into the block's lanes and writes it encoded into the packet; a
// segmented radix sort on the device ranks each tensor's chunks; a second kernel turns ranks into
// classes and writes the headers. Output is byte-identical to the CPU packer's.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "client/packer/packer.h"

namespace dlcp {

// OK when cudaGetDeviceCount finds a device; otherwise the runtime's error, named.
absl::Status CudaDeviceStatus();

absl::StatusOr<std::unique_ptr<Packer>> CreateCudaPacker(int device, const ClassPolicyOptions& policy);

}  // namespace dlcp
