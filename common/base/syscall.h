// Every system call goes through DLCP_SYSCALL: it retries on EINTR and, on failure, yields an
// absl::Status that names the call and errno. Use it in functions returning absl::Status/StatusOr.
#pragma once

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/status/status.h"

namespace dlcp {

// Maps errno to the closest absl code so callers can branch on it (e.g. EAGAIN -> Unavailable).
absl::Status ErrnoToStatus(int err, const std::string& what);

// Runs `expr` until it does not fail with EINTR. The result is the call's return value.
#define DLCP_RETRY_EINTR(expr)                       \
  ({                                                 \
    decltype(expr) dlcp_rc_;                         \
    do {                                             \
      dlcp_rc_ = (expr);                             \
    } while (dlcp_rc_ == -1 && errno == EINTR);      \
    dlcp_rc_;                                        \
  })

// Evaluates to the call's return value; on -1 returns ErrnoToStatus from the enclosing function.
#define DLCP_SYSCALL(expr)                                              \
  ({                                                                    \
    auto dlcp_sc_ = DLCP_RETRY_EINTR(expr);                             \
    if (dlcp_sc_ == -1) return ::dlcp::ErrnoToStatus(errno, #expr);     \
    dlcp_sc_;                                                           \
  })

}  // namespace dlcp
