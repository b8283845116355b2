// A wake-up word in shared memory (a futex): waiters sleep in the kernel until it changes or their
// deadline passes, and a publisher bumps it and wakes them all. A waiter reads the word before it
// checks its condition, so a publication between the check and the sleep changes the word and
// the sleep returns at once: no wake-up is lost.
//
// Threading: any threads of any processes that map the word.
#pragma once

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"

namespace dlcp {

// After publishing (a release store): bumps the word and wakes every sleeper.
void RingBell(std::atomic<uint32_t>& bell);
// Sleeps while the word still holds `seen` (read before the caller checked its condition), at
// most until `deadline`; returns false once the deadline has passed.
bool SleepOnBell(std::atomic<uint32_t>& bell, uint32_t seen, absl::Time deadline);

}  // namespace dlcp
