#include "common/datapath/delay_signal.h"

#include <gtest/gtest.h>

#include "common/datapath/congestion_window.h"

namespace dlcp {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

// A sender and its peer: `n` datagrams leave one every `gap`, each answered `rtt` later, except
// every `lose_every`-th (0: none), which is lost. Each loss goes to the window as the engine
// hands it on: a cut only while the round trips are raised. Returns the time after the last.
struct Path {
  DelaySignal signal;
  CongestionWindow window;
  uint64_t stamp = 0;
  int losses = 0, tolerated = 0;

  absl::Time Run(absl::Time t, int n, absl::Duration gap, absl::Duration rtt, int lose_every = 0) {
    for (int i = 0; i < n; ++i, t += gap) {
      ++stamp;
      window.OnSent(stamp);
      signal.OnSent(stamp, t);
      if (lose_every > 0 && stamp % lose_every == 0) {
        ++losses;
        if (signal.Raised()) {
          window.OnLoss(stamp);
        } else {
          ++tolerated;
        }
        continue;
      }
      signal.OnAnswered(stamp, t + rtt);
      window.OnAcked(1);
    }
    return t;
  }
};

TEST(DelaySignalTest, KnowsNothingUntilEnoughSamplesCame) {
  DelaySignal s;
  EXPECT_TRUE(s.Raised());
  for (uint64_t i = 1; i < 16; ++i) {
    s.OnSent(i, kT0);
    s.OnAnswered(i, kT0 + absl::Microseconds(100));
    EXPECT_TRUE(s.Raised()) << i << " samples";
  }
  s.OnSent(16, kT0);
  s.OnAnswered(16, kT0 + absl::Microseconds(100));
  EXPECT_FALSE(s.Raised());
  EXPECT_EQ(s.base(), absl::Microseconds(100));
  EXPECT_EQ(s.recent(), absl::Microseconds(100));
}

TEST(DelaySignalTest, DropsWithFlatDelayDoNotCutTheWindow) {
  Path p;
  // 10% of the datagrams lost, every round trip 200 us: no loss is congestion.
  p.Run(kT0, 2000, absl::Microseconds(10), absl::Microseconds(200), 10);
  EXPECT_EQ(p.losses, 200);
  // The first losses come before 16 samples did, and count as congestion, as without the signal.
  EXPECT_GE(p.tolerated, 198);
  EXPECT_LE(p.window.cuts(), 1u);
  EXPECT_GT(p.window.window(), 50u);  // it grew the whole time after
  // Every loss taken as congestion (a signal that never knows), as the window did before.
  DelaySignalOptions never;
  never.recent = 4096;  // more samples than the run has
  Path q{DelaySignal(never), CongestionWindow()};
  q.Run(kT0, 2000, absl::Microseconds(10), absl::Microseconds(200), 10);
  EXPECT_GT(q.window.cuts(), 100u);
  EXPECT_LT(q.window.window(), 10u);
}

TEST(DelaySignalTest, DropsWithRisingDelayCutTheWindow) {
  Path p;
  absl::Time t = p.Run(kT0, 200, absl::Microseconds(10), absl::Microseconds(200));
  EXPECT_FALSE(p.signal.Raised());
  // A queue fills: round trips climb 20 us per datagram, well past the 0.7 ms threshold.
  for (int i = 0; i < 200; ++i) t = p.Run(t, 1, absl::Microseconds(10), absl::Microseconds(200 + 20 * i));
  EXPECT_TRUE(p.signal.Raised());
  const uint64_t cuts = p.window.cuts();
  p.Run(t, 100, absl::Microseconds(10), absl::Microseconds(5000), 10);
  EXPECT_EQ(p.tolerated, 0);
  EXPECT_GT(p.window.cuts(), cuts);
}

TEST(DelaySignalTest, ALongBaseRaisesTheThresholdWithIt) {
  DelaySignalOptions o;
  o.floor = absl::Milliseconds(1);
  o.ratio = 1.0;
  Path p{DelaySignal(o), CongestionWindow()};
  // A 20 ms path (a WAN): 25 ms round trips are within its own base of it, 45 ms are not.
  absl::Time t = p.Run(kT0, 100, absl::Microseconds(100), absl::Milliseconds(20));
  t = p.Run(t, 100, absl::Microseconds(100), absl::Milliseconds(25));
  EXPECT_FALSE(p.signal.Raised());
  p.Run(t, 100, absl::Microseconds(100), absl::Milliseconds(45));
  EXPECT_TRUE(p.signal.Raised());
}

TEST(DelaySignalTest, ThePathsBaseFollowsAPathThatGotLonger) {
  DelaySignalOptions o;
  o.base_span = absl::Seconds(1);
  Path p{DelaySignal(o), CongestionWindow()};
  absl::Time t = p.Run(kT0, 100, absl::Milliseconds(1), absl::Microseconds(100));
  // Moved to a path 3 ms longer (an aggregator remapped): raised at first...
  t = p.Run(t, 100, absl::Milliseconds(1), absl::Microseconds(3100));
  EXPECT_TRUE(p.signal.Raised());
  // ...and no longer once the short path's samples are older than the span.
  p.Run(t, 1200, absl::Milliseconds(1), absl::Microseconds(3100));
  EXPECT_FALSE(p.signal.Raised());
  EXPECT_EQ(p.signal.base(), absl::Microseconds(3100));
}

TEST(DelaySignalTest, AfterAPauseLongerThanTheSpanTheBaseStartsAfresh) {
  DelaySignalOptions o;
  o.base_span = absl::Seconds(1);
  Path p{DelaySignal(o), CongestionWindow()};
  absl::Time t = p.Run(kT0, 100, absl::Milliseconds(1), absl::Microseconds(100));
  // Nothing for 5 s, then a path 3 ms longer: the old base is forgotten at once, not a quarter
  // of the span at a time.
  t = p.Run(t + absl::Seconds(5), 16, absl::Milliseconds(1), absl::Microseconds(3100));
  EXPECT_EQ(p.signal.base(), absl::Microseconds(3100));
  EXPECT_FALSE(p.signal.Raised());
}

TEST(DelaySignalTest, OnlyAnswersToRecordedDatagramsAreSamples) {
  DelaySignalOptions o;
  o.capacity = 8;
  o.recent = 1;
  DelaySignal s(o);
  s.OnSent(1, kT0);
  s.OnSent(9, kT0 + absl::Milliseconds(5));  // takes stamp 1's slot
  s.OnAnswered(1, kT0 + absl::Milliseconds(6));
  EXPECT_EQ(s.recent(), absl::InfiniteDuration());
  s.OnAnswered(9, kT0 + absl::Milliseconds(6));
  EXPECT_EQ(s.recent(), absl::Milliseconds(1));
  // A second answer to the same datagram (a duplicate result) is no second sample.
  s.OnAnswered(9, kT0 + absl::Milliseconds(50));
  EXPECT_EQ(s.base(), absl::Milliseconds(1));
  EXPECT_EQ(s.recent(), absl::Milliseconds(1));
  s.OnAnswered(77, kT0);  // never sent
  EXPECT_EQ(s.recent(), absl::Milliseconds(1));
}

}  // namespace
}  // namespace dlcp
