// How a transport's Receive blocks: poll(2) on its own descriptor (a socket, a completion
// channel) and on an eventfd that Wake() writes, so another thread can end the wait early.
// Shared by the UDP and RDMA transports.
//
// Threading: Wake may be called from any thread; Wait and TakeWoken by the receiving thread only.
#pragma once

#include <atomic>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dlcp {

// Milliseconds from now to `deadline`, rounded up, for poll(2): 0 once it has passed, at most 1 s.
int PollTimeoutMs(absl::Time deadline);

class Waker {
 public:
  Waker() = default;
  ~Waker();
  Waker(const Waker&) = delete;
  Waker& operator=(const Waker&) = delete;

  absl::Status Init();
  // Makes the current Wait, or the next one, return promptly.
  void Wake();
  // True once per Wake that no Wait has reported yet (for loops that check before blocking).
  bool TakeWoken() { return woken_.exchange(false); }

  struct Result {
    bool readable = false;  // `fd` has input
    bool woken = false;     // Wake() was called
  };
  // Blocks until `fd` has input, Wake() is called, or `deadline` passes (both false).
  absl::StatusOr<Result> Wait(int fd, absl::Time deadline);

 private:
  int fd_ = -1;
  std::atomic<bool> woken_{false};
};

}  // namespace dlcp
