#include "server/control/limited_listener.h"

#include <netinet/in.h>
#include <netinet/ip.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "common/rpc/socket_marks.h"
#include "common/transport/address.h"

namespace dlcp::server {

std::string BindProblem(int port, int err) {
  if (err == EADDRINUSE) return absl::StrCat("port ", port, " is in use (another dlcpd, or another process)");
  return std::strerror(err);
}

absl::StatusOr<std::unique_ptr<LimitedListener>> LimitedListener::Bind(const std::string& host, uint16_t port,
                                                                       uint8_t dscp, ConnectionLimiter* limiter) {
  absl::StatusOr<Address> a = ResolveAddress(host, port);
  if (!a.ok()) return absl::UnavailableError(a.status().message());
  const SockAddr sa = a->ToSockaddr();
  const int fd = ::socket(sa.get()->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(BindProblem(port, errno));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // restarts within TIME_WAIT; not REUSEPORT
  // Accepted connections inherit the mark: control rides the top class, like the data plane's
  // control messages.
  MarkSocketDscp(fd, dscp);
  if (::bind(fd, sa.get(), sa.len) != 0 || ::listen(fd, SOMAXCONN) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(BindProblem(port, err));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const uint16_t actual = Address::FromSockaddr(reinterpret_cast<const sockaddr*>(&bound)).port;
  return std::unique_ptr<LimitedListener>(new LimitedListener(fd, actual, limiter));
}

LimitedListener::~LimitedListener() { Stop(); }

void LimitedListener::ServeWith(grpc::ServerBuilder* builder,
                                const std::shared_ptr<grpc::ServerCredentials>& credentials) {
  acceptor_ = builder->experimental().AddExternalConnectionAcceptor(
      grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD, credentials);
}

void LimitedListener::Start() { thread_ = std::thread([this] { AcceptLoop(); }); }

void LimitedListener::Stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void LimitedListener::AcceptLoop() {
  while (!stop_.load()) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;  // the timeout bounds how long Stop waits
    const int conn = ::accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (conn < 0) {
      // Out of descriptors, say: the connection waits in the backlog, and we do not spin.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) ::usleep(10000);
      continue;
    }
    if (limiter_->Admit(conn) != ConnectionLimiter::Verdict::kAdmitted) {
      ::close(conn);
      continue;
    }
    grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters params;
    params.listener_fd = fd_;
    params.fd = conn;
    acceptor_->HandleNewConnection(&params);  // gRPC owns the connection from here
  }
}

}  // namespace dlcp::server
