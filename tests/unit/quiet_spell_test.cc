#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "common/datapath/quiet_spell.h"

namespace dlcp {
namespace {

TEST(QuietSpell, FollowsTheMeanGapWithinItsFloorAndCap) {
  const absl::Time t0 = MonotonicNow();
  // 100 arrivals over 50 ms: a mean gap of 0.5 ms, 16 of them 8 ms, capped at 5 ms.
  EXPECT_EQ(QuietSpellEnd(t0, t0 + absl::Milliseconds(50), 100, 16, absl::Milliseconds(1), absl::Milliseconds(5)),
            t0 + absl::Milliseconds(55));
  // Over 2 ms: 16 gaps of 20 us, raised to the 1 ms floor.
  EXPECT_EQ(QuietSpellEnd(t0, t0 + absl::Milliseconds(2), 100, 16, absl::Milliseconds(1), absl::Milliseconds(5)),
            t0 + absl::Milliseconds(3));
}

TEST(QuietSpell, ASlowTransferGetsItsOwnGapsPastTheCap) {
  const absl::Time first = MonotonicNow();
  // 101 results 2 ms apart after the first (a 10 Mbit/s path): 16 gaps are 32 ms.
  EXPECT_EQ(PacedQuiet(first, first + absl::Milliseconds(200), 101, 16), absl::Milliseconds(32));
  // Too few arrivals to know the pace: nothing beyond the usual rule.
  EXPECT_EQ(PacedQuiet(first, first + absl::Milliseconds(200), kPacedMinArrivals - 1, 16), absl::ZeroDuration());
  // A fast transfer's own gaps are far below the cap; the usual rule decides.
  EXPECT_EQ(PacedQuiet(first, first + absl::Milliseconds(2), 101, 16), absl::Microseconds(320));
  // A crawl waits at most kMaxPacedQuiet.
  EXPECT_EQ(PacedQuiet(first, first + absl::Seconds(20), 101, 16), kMaxPacedQuiet);
}

TEST(QuietSpell, ARepairWaitsForTheLongerOfTheCappedSpellAndItsOwnPace) {
  const absl::Time start = MonotonicNow();
  const absl::Duration cap = absl::Milliseconds(5);
  // Fast: 100 arrivals over 50 ms from the start, 16 mean gaps capped at 5 ms; the pace since the
  // first (at 40 ms: 16 gaps of about 0.1 ms) is shorter.
  EXPECT_EQ(RepairQuiet(start, start + absl::Milliseconds(40), start + absl::Milliseconds(50), 100, cap), cap);
  // Slow: 101 arrivals 2 ms apart after the first; their 16 gaps, 32 ms, pass the cap.
  EXPECT_EQ(RepairQuiet(start, start, start + absl::Milliseconds(200), 101, cap), absl::Milliseconds(32));
  // Too few arrivals for a pace: the capped spell.
  EXPECT_EQ(RepairQuiet(start, start, start + absl::Milliseconds(200), 10, cap), cap);
}

}  // namespace
}  // namespace dlcp
