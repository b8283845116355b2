// ConnectionLimiter over real loopback TCP connections: the bounds it holds, and closing a
// connection it was asked to close later, but not a socket that took its number since.
#include "server/control/connection_limits.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/time/clock.h"

namespace dlcp {
namespace {

// A listening loopback socket and the connections made to it, closed at the end.
class Loopback {
 public:
  Loopback() {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(listen_fd_, 16), 0);
    socklen_t len = sizeof(a);
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    addr_ = a;
  }
  ~Loopback() {
    for (int fd : fds_) ::close(fd);
    ::close(listen_fd_);
  }
  // Connects; returns {client fd, accepted fd} and the client's port.
  std::pair<int, int> Connect(uint16_t* client_port) {
    const int c = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_EQ(::connect(c, reinterpret_cast<const sockaddr*>(&addr_), sizeof(addr_)), 0);
    sockaddr_in me{};
    socklen_t len = sizeof(me);
    ::getsockname(c, reinterpret_cast<sockaddr*>(&me), &len);
    *client_port = ntohs(me.sin_port);
    const int s = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    fds_.push_back(c);
    return {c, s};
  }

 private:
  int listen_fd_ = -1;
  sockaddr_in addr_{};
  std::vector<int> fds_;
};

// True if `fd` reads end-of-stream within 300 ms (a shutdown's FIN crosses loopback at once).
bool SeesEnd(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 300) != 1) return false;
  char c;
  return ::recv(fd, &c, 1, MSG_DONTWAIT) == 0;
}

TEST(ConnectionLimiter, HoldsItsPerPeerBound) {
  Loopback net;
  ConnectionLimiter limiter(ConnectionLimits{16, 2});
  uint16_t port;
  std::vector<int> accepted;
  for (int i = 0; i < 3; ++i) accepted.push_back(net.Connect(&port).second);
  EXPECT_EQ(limiter.Admit(accepted[0]), ConnectionLimiter::Verdict::kAdmitted);
  EXPECT_EQ(limiter.Admit(accepted[1]), ConnectionLimiter::Verdict::kAdmitted);
  EXPECT_EQ(limiter.Admit(accepted[2]), ConnectionLimiter::Verdict::kPerPeer);
  EXPECT_EQ(limiter.refused_per_peer(), 1u);
  for (int fd : accepted) ::close(fd);
}

TEST(ConnectionLimiter, ClosesAConnectionWhenDueAndOnlyThatOne) {
  Loopback net;
  ConnectionLimiter limiter(ConnectionLimits{});
  uint16_t port_a, port_b;
  auto [client_a, server_a] = net.Connect(&port_a);
  auto [client_b, server_b] = net.Connect(&port_b);
  ASSERT_EQ(limiter.Admit(server_a), ConnectionLimiter::Verdict::kAdmitted);
  ASSERT_EQ(limiter.Admit(server_b), ConnectionLimiter::Verdict::kAdmitted);
  const absl::Time now = absl::Now();
  limiter.CloseLater("127.0.0.1", port_a, now + absl::Seconds(1));
  limiter.CloseLater("127.0.0.1", port_a, now + absl::Seconds(1));  // refused twice: marked once
  limiter.CloseDue(now);  // not yet due
  EXPECT_FALSE(SeesEnd(client_a));
  limiter.CloseDue(now + absl::Seconds(1));
  EXPECT_TRUE(SeesEnd(client_a));
  EXPECT_FALSE(SeesEnd(client_b));
  EXPECT_EQ(limiter.closed_later(), 1u);
  ::close(server_a);
  ::close(server_b);
}

// The marked connection's fd is closed (gRPC closed it) and its number taken by another socket
// before the mark is due: that socket is left alone.
TEST(ConnectionLimiter, LeavesASocketThatTookTheNumberOfAMarkedOne) {
  Loopback net;
  ConnectionLimiter limiter(ConnectionLimits{});
  uint16_t port_a, port_b;
  auto [client_a, server_a] = net.Connect(&port_a);
  ASSERT_EQ(limiter.Admit(server_a), ConnectionLimiter::Verdict::kAdmitted);
  const absl::Time now = absl::Now();
  limiter.CloseLater("127.0.0.1", port_a, now);
  auto [client_b, accepted_b] = net.Connect(&port_b);
  ::close(server_a);
  ASSERT_EQ(::dup2(accepted_b, server_a), server_a);  // another connection under the marked number
  ::close(accepted_b);
  limiter.CloseDue(now);
  EXPECT_FALSE(SeesEnd(client_b));
  EXPECT_EQ(limiter.closed_later(), 0u);
  ::close(server_a);
}

}  // namespace
}  // namespace dlcp
