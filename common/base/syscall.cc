#include "common/base/syscall.h"

#include "absl/strings/str_cat.h"

namespace dlcp {
absl::Status ErrnoToStatus(int err, const std::string& what) {
  std::string msg = absl::StrCat(what, ": ", std::strerror(err), " (errno ", err, ")");
  switch (err) {
    case EAGAIN:
    case ENOBUFS:
    case ECONNREFUSED:
      return absl::UnavailableError(msg);
    case EINVAL:
    case EMSGSIZE:
    case EAFNOSUPPORT:
      return absl::InvalidArgumentError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case EADDRINUSE:
      return absl::AlreadyExistsError(msg);
    case ENOMEM:
      return absl::ResourceExhaustedError(msg);
    default:
      return absl::InternalError(msg);
  }
}
}  // namespace dlcp
