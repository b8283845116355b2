#include "common/shm/descriptor_passing.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/syscall.h"
#include "common/transport/waker.h"

namespace dlcp {

OwnedFd& OwnedFd::operator=(OwnedFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.Release();
  }
  return *this;
}

OwnedFd::~OwnedFd() {
  if (fd_ >= 0) ::close(fd_);
}

int OwnedFd::Release() { return std::exchange(fd_, -1); }

absl::StatusOr<PeerCredentials> PeerOf(int unix_socket) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  DLCP_SYSCALL(::getsockopt(unix_socket, SOL_SOCKET, SO_PEERCRED, &cred, &len));
  return PeerCredentials{cred.pid, cred.uid, cred.gid};
}

absl::Status SendWithDescriptors(int unix_socket, absl::Span<const uint8_t> message, absl::Span<const int> fds) {
  if (message.empty()) return absl::InvalidArgumentError("a message that carries descriptors needs a byte");
  if (fds.size() > kMaxPassedDescriptors) {
    return absl::InvalidArgumentError(
        absl::StrCat(fds.size(), " descriptors in one message; at most ", kMaxPassedDescriptors));
  }
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedDescriptors)] = {};
  iovec iov{const_cast<uint8_t*>(message.data()), message.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  const ssize_t sent = DLCP_RETRY_EINTR(::sendmsg(unix_socket, &msg, MSG_NOSIGNAL));
  if (sent < 0) {
    const int err = errno;
    if (err == EPIPE || err == ECONNRESET) return absl::UnavailableError("the peer closed its socket");
    return ErrnoToStatus(err, "sendmsg with descriptors");
  }
  if (static_cast<size_t>(sent) != message.size()) {
    return absl::DataLossError(absl::StrCat("sent ", sent, " of a message's ", message.size(), " bytes"));
  }
  return absl::OkStatus();
}

namespace {

// The descriptors a received message carries, each owned (whatever else is wrong with it).
std::vector<OwnedFd> TakeDescriptors(msghdr& msg) {
  std::vector<OwnedFd> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      fds.emplace_back(fd);
    }
  }
  return fds;
}

}  // namespace

absl::StatusOr<ReceivedMessage> ReceiveWithDescriptors(int unix_socket, size_t max_bytes, absl::Time deadline) {
  pollfd p{unix_socket, POLLIN, 0};
  for (;;) {
    const int ready = DLCP_RETRY_EINTR(::poll(&p, 1, PollTimeoutMs(deadline)));
    if (ready < 0) return ErrnoToStatus(errno, "poll of a Unix socket");
    if (ready > 0) break;
    if (PollTimeoutMs(deadline) == 0) return absl::DeadlineExceededError("no message with descriptors came in time");
  }
  ReceivedMessage out;
  out.message.resize(max_bytes);
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedDescriptors)] = {};
  iovec iov{out.message.data(), out.message.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t got = DLCP_RETRY_EINTR(::recvmsg(unix_socket, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT));
  if (got < 0) return ErrnoToStatus(errno, "recvmsg with descriptors");
  out.fds = TakeDescriptors(msg);  // owned from here: closed on every error below
  if (got == 0) return absl::UnavailableError("the peer closed its socket");
  if (msg.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) {
    return absl::DataLossError(absl::StrCat("a message with descriptors was cut short (over ", max_bytes,
                                            " bytes or ", kMaxPassedDescriptors, " descriptors)"));
  }
  out.message.resize(static_cast<size_t>(got));
  return out;
}

}  // namespace dlcp
