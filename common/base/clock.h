// The clock every deadline, timeout, interval and heartbeat age in dlcp is measured on.
//
// It is monotonic (CLOCK_MONOTONIC, through std::chrono::steady_clock): a step of the wall clock
// (NTP or chrony stepping it, a VM resumed, `date -s`) must neither fire every heartbeat and op
// deadline at once, failing every job, nor hold them all off until the wall clock catches up.
//
// Its absl::Time values are only for comparing with and subtracting from each other. They are
// not dates: not for logs, not for gRPC deadlines (system_clock), and not for
// condition_variable::wait_until; wait for a duration computed from them instead. They lie 2^62 ns
// (about 146 years) past the Unix epoch plus the time since boot, so that a zero left for "never"
// in a nanosecond field stays as far in the past as it was with wall-clock time, and a value that
// strays into a log is plainly not today's date.
#pragma once

#include <chrono>
#include <cstdint>

#include "absl/time/time.h"

namespace dlcp {

inline int64_t MonotonicNanos() {
  constexpr int64_t kOffset = int64_t{1} << 62;
  return kOffset + std::chrono::duration_cast<std::chrono::nanoseconds>(
                       std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline absl::Time MonotonicNow() { return absl::FromUnixNanos(MonotonicNanos()); }

}  // namespace dlcp
