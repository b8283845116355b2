// CUDA runtime errors as Status, naming the call that failed.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dlcp {

inline absl::Status CudaError(const char* what, cudaError_t e) {
  return absl::InternalError(absl::StrCat(what, ": CUDA error ", static_cast<int>(e), " (", cudaGetErrorString(e), ")"));
}

}  // namespace dlcp

#define DLCP_CUDA_RETURN(call)                                          \
  do {                                                                  \
    const cudaError_t dlcp_e_ = (call);                                 \
    if (dlcp_e_ != cudaSuccess) return ::dlcp::CudaError(#call, dlcp_e_); \
  } while (0)
