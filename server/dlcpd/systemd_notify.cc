#include "server/dlcpd/systemd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/syscall.h"

namespace dlcp::server {

absl::Status NotifyServiceManager(absl::string_view state) {
  const char* env = std::getenv("NOTIFY_SOCKET");  // the service manager's protocol, not a setting
  if (env == nullptr || env[0] == '\0') return absl::OkStatus();
  const absl::string_view path(env);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path[0] != '/' && path[0] != '@') {
    return absl::InvalidArgumentError(absl::StrCat("NOTIFY_SOCKET '", path, "' is neither a path nor '@name'"));
  }
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("NOTIFY_SOCKET '", path, "' is longer than a socket address"));
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (path[0] == '@') addr.sun_path[0] = '\0';  // abstract namespace
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size());
  const int fd = DLCP_SYSCALL(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  const ssize_t sent = DLCP_RETRY_EINTR(
      ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&addr), len));
  const int err = errno;
  ::close(fd);
  if (sent < 0) return ErrnoToStatus(err, absl::StrCat("sendto(NOTIFY_SOCKET ", path, ")"));
  return absl::OkStatus();
}

}  // namespace dlcp::server
