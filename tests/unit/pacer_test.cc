#include "common/datapath/pacer.h"

#include <gtest/gtest.h>

#include <limits>

namespace dlcp {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

// Answers `n` datagrams, one every `gap`, from `start`; returns when the last came.
absl::Time Deliver(Pacer& p, absl::Time start, int n, absl::Duration gap) {
  absl::Time t = start;
  for (int i = 0; i < n; ++i) {
    p.OnDelivered(1, t);
    t += gap;
  }
  return t - gap;
}

TEST(PacerTest, NothingIsPacedBeforeTheFirstSample) {
  Pacer p;
  EXPECT_EQ(p.rate(), 0);
  EXPECT_EQ(p.Allowance(kT0), std::numeric_limits<uint32_t>::max());
  // Two answers, 1 ms apart: too few and too short to be a sample.
  p.OnDelivered(1, kT0);
  p.OnDelivered(1, kT0 + absl::Milliseconds(1));
  EXPECT_EQ(p.rate(), 0);
}

TEST(PacerTest, PacesAtTheGainTimesTheDeliveryRate) {
  PacerOptions o;
  o.gain = 1.25;
  o.burst = 8;
  Pacer p(o);
  // One answer every 100 us: 10,000 per second.
  const absl::Time last = Deliver(p, kT0, 100, absl::Microseconds(100));
  EXPECT_NEAR(p.rate(), 12500, 200);
  // A full bucket: the larger of 8 and 2 ms at the rate (25).
  const uint32_t first = p.Allowance(last);
  EXPECT_EQ(first, 25u);
  p.OnSent(first);
  EXPECT_EQ(p.Allowance(last), 0u);
  // The next one may leave 80 us later (1 / 12,500 s), and 10 ms later 125 more could, but the
  // bucket holds only 25.
  const absl::Time next = p.NextSend(last);
  EXPECT_NEAR(absl::ToDoubleMicroseconds(next - last), 80, 2);
  EXPECT_EQ(p.Allowance(next + absl::Microseconds(1)), 1u);
  EXPECT_EQ(p.Allowance(last + absl::Milliseconds(10)), 25u);
}

TEST(PacerTest, TheBestRecentSampleSetsTheRate) {
  Pacer p;
  absl::Time t = Deliver(p, kT0, 100, absl::Microseconds(100));  // 10,000 per second
  const double fast = p.rate();
  // Slower answers (a worker waiting on another) for two samples do not pull the rate down yet.
  t = Deliver(p, t + absl::Microseconds(400), 20, absl::Microseconds(400));
  EXPECT_DOUBLE_EQ(p.rate(), fast);
  // Once every recent sample is slow, it is.
  Deliver(p, t + absl::Microseconds(400), 60, absl::Microseconds(400));
  EXPECT_NEAR(p.rate(), 2500 * PacerOptions().gain, 100);
}

TEST(PacerTest, AGapInTheAnswersIsNotASample) {
  Pacer p;
  absl::Time t = Deliver(p, kT0, 100, absl::Microseconds(100));
  const double before = p.rate();
  // 50 ms of nothing (the round waits), then answers at the old pace: no sample spans the gap.
  t = Deliver(p, t + absl::Milliseconds(50), 100, absl::Microseconds(100));
  EXPECT_NEAR(p.rate(), before, before * 0.02);
}

// A rate measured while the peer waited on someone else may be low; answers then come as far
// apart as the pacer spaces the pushes, and they must still make samples, or the rate could
// never rise again.
TEST(PacerTest, ALowRateStillRisesWithItsAnswers) {
  Pacer p;
  absl::Time t = Deliver(p, kT0, 12, absl::Milliseconds(15));  // 67 per second
  const double slow = p.rate();
  ASSERT_GT(slow, 0);
  EXPECT_LT(slow, 200);
  // The path frees up: each answer comes as soon as the pacer lets its push out.
  for (int i = 0; i < 200; ++i) {
    t = std::max(t + absl::Microseconds(100), p.NextSend(t));
    if (p.Allowance(t) > 0) p.OnSent(1);
    p.OnDelivered(1, t);
  }
  EXPECT_GT(p.rate(), 4 * slow);
}

// A datagram that may not wait (a repair) leaves beyond the allowance; the next ones wait for it.
TEST(PacerTest, SendingBeyondTheAllowanceDelaysWhatFollows) {
  PacerOptions o;
  o.gain = 1;
  Pacer p(o);
  const absl::Time last = Deliver(p, kT0, 100, absl::Microseconds(100));  // 10,000 per second
  const uint32_t all = p.Allowance(last);
  p.OnSent(all + 5);  // five repairs more
  EXPECT_EQ(p.Allowance(last), 0u);
  // Six datagrams' time (600 us) before the next may leave.
  EXPECT_NEAR(absl::ToDoubleMicroseconds(p.NextSend(last) - last), 600, 5);
}

}  // namespace
}  // namespace dlcp
