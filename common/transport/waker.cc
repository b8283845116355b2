#include "common/transport/waker.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "common/base/syscall.h"

namespace dlcp {

int PollTimeoutMs(absl::Time deadline) {
  absl::Duration left = deadline - MonotonicNow();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), 1000));
}

Waker::~Waker() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status Waker::Init() {
  fd_ = DLCP_SYSCALL(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  return absl::OkStatus();
}

void Waker::Wake() {
  woken_.store(true);
  uint64_t one = 1;
  ssize_t unused = ::write(fd_, &one, sizeof(one));
  (void)unused;
}

absl::StatusOr<Waker::Result> Waker::Wait(int fd, absl::Time deadline) {
  pollfd p[2] = {{fd, POLLIN, 0}, {fd_, POLLIN, 0}};
  const int rc = DLCP_RETRY_EINTR(::poll(p, 2, PollTimeoutMs(deadline)));
  if (rc < 0) return ErrnoToStatus(errno, "poll");
  Result r;
  r.readable = (p[0].revents & POLLIN) != 0;
  if (p[1].revents & POLLIN) {
    uint64_t v;
    ssize_t unused = ::read(fd_, &v, sizeof(v));
    (void)unused;
    woken_.store(false);
    r.woken = true;
  }
  return r;
}

}  // namespace dlcp
