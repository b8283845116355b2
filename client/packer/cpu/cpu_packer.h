// The reference packer: host memory in, host memory out. Chunk by chunk it widens the values to
// float32 (when the tensor holds 16-bit values), folds their squares into the magnitude lanes and
// encodes the payload; then it ranks each tensor's chunks and writes the headers.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "client/packer/packer.h"

namespace dlcp {

absl::StatusOr<std::unique_ptr<Packer>> CreateCpuPacker(const ClassPolicyOptions& policy);

}  // namespace dlcp
