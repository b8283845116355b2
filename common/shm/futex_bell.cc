#include "common/shm/futex_bell.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>

#include "common/base/clock.h"

namespace dlcp {
namespace {

long Futex(std::atomic<uint32_t>& word, int op, uint32_t value, const timespec* timeout) {
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), op, value, timeout, nullptr, 0);
}

}  // namespace

void RingBell(std::atomic<uint32_t>& bell) {
  bell.fetch_add(1, std::memory_order_seq_cst);
  Futex(bell, FUTEX_WAKE, INT32_MAX, nullptr);
}

bool SleepOnBell(std::atomic<uint32_t>& bell, uint32_t seen, absl::Time deadline) {
  const absl::Duration left = deadline - MonotonicNow();
  if (left <= absl::ZeroDuration()) return false;
  // A relative timeout, at most a second, so a clock that jumps cannot stretch the wait.
  const timespec ts = absl::ToTimespec(std::min(left, absl::Seconds(1)));
  Futex(bell, FUTEX_WAIT, seen, &ts);  // EAGAIN (the word moved), EINTR or ETIMEDOUT: the caller looks again
  return true;
}

}  // namespace dlcp
