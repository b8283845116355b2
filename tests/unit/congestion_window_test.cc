#include "common/datapath/congestion_window.h"

#include <gtest/gtest.h>

#include <vector>

namespace dlcp {
namespace {

CongestionOptions Opts(uint32_t initial, uint32_t min, uint32_t max) {
  CongestionOptions o;
  o.initial = initial;
  o.min = min;
  o.max = max;
  o.reorder = 8;
  return o;
}

TEST(CongestionWindowTest, SlowStartDoublesPerWindowThenStopsAtMax) {
  CongestionWindow w(Opts(4, 2, 100));
  EXPECT_EQ(w.window(), 4u);
  w.OnAcked(4);
  EXPECT_EQ(w.window(), 8u);
  w.OnAcked(8);
  EXPECT_EQ(w.window(), 16u);
  w.OnAcked(1000);
  EXPECT_EQ(w.window(), 100u);
}

// Code in a trainer never aborts: options out of range are brought into range.
TEST(CongestionWindowTest, OutOfRangeOptionsAreNormalizedNotFatal) {
  CongestionOptions o = Opts(16, 0, 0);
  o.decrease = 1.5;
  CongestionWindow w(o);
  EXPECT_EQ(w.window(), 1u);  // max 0 counts as 1, and the window never goes below min 1
  w.OnLoss(w.Stamp());
  EXPECT_EQ(w.window(), 1u);
  CongestionOptions inverted = Opts(8, 32, 16);  // min above max: min becomes max
  inverted.decrease = 0.0;
  CongestionWindow v(inverted);
  EXPECT_EQ(v.window(), 16u);
  v.OnLoss(v.Stamp());
  EXPECT_EQ(v.window(), 16u);
}

TEST(CongestionWindowTest, LossHalvesOncePerCongestionEvent) {
  CongestionWindow w(Opts(64, 2, 100));
  std::vector<uint64_t> stamps;
  for (int i = 0; i < 64; ++i) stamps.push_back(w.Stamp());
  EXPECT_TRUE(w.OnLoss(stamps[10]));
  EXPECT_EQ(w.window(), 32u);
  // Sent before the cut: the same event, no second cut.
  EXPECT_FALSE(w.OnLoss(stamps[11]));
  EXPECT_FALSE(w.OnLoss(stamps[63]));
  EXPECT_EQ(w.window(), 32u);
  // Sent after the cut: a new event.
  const uint64_t later = w.Stamp();
  EXPECT_TRUE(w.OnLoss(later));
  EXPECT_EQ(w.window(), 16u);
  EXPECT_EQ(w.cuts(), 2u);
}

TEST(CongestionWindowTest, CongestionAvoidanceGrowsOnePerWindow) {
  CongestionWindow w(Opts(40, 2, 100));
  EXPECT_TRUE(w.OnLoss(w.Stamp()));
  ASSERT_EQ(w.window(), 20u);
  w.OnAcked(21);  // about one window's worth: +1, not +21
  EXPECT_EQ(w.window(), 21u);
  w.OnAcked(22);
  EXPECT_EQ(w.window(), 22u);
}

TEST(CongestionWindowTest, NeverBelowMinOrAboveMax) {
  CongestionWindow w(Opts(1000, 3, 50));
  EXPECT_EQ(w.window(), 50u);
  for (int i = 0; i < 20; ++i) {
    w.OnSilence(0);
    EXPECT_GE(w.window(), 3u);
  }
  EXPECT_EQ(w.window(), 3u);
  CongestionWindow tiny(Opts(0, 3, 50));
  EXPECT_EQ(tiny.window(), 3u);
}

TEST(CongestionWindowTest, LateDatagramUndoesItsCutAndWidensReorderSlack) {
  CongestionWindow w(Opts(64, 2, 100));
  const uint64_t a = w.Stamp(), b = w.Stamp();
  EXPECT_EQ(w.reorder(), 8u);
  ASSERT_TRUE(w.OnLoss(a));
  EXPECT_EQ(w.window(), 32u);
  w.OnLate(b);  // not the one that caused the cut
  EXPECT_EQ(w.window(), 32u);
  EXPECT_TRUE(w.OnLate(a));
  EXPECT_EQ(w.window(), 64u);
  EXPECT_EQ(w.undone(), 1u);
  EXPECT_EQ(w.reorder(), 16u);
  w.OnLate(a);  // once only
  EXPECT_EQ(w.undone(), 1u);
  // A silence with no datagram to blame cannot be undone; one whose oldest datagram turns up can.
  w.OnSilence(0);
  EXPECT_FALSE(w.OnLate(0));
  EXPECT_EQ(w.window(), 32u);
  const uint64_t c = w.Stamp();
  w.OnSilence(c);
  EXPECT_EQ(w.window(), 16u);
  EXPECT_TRUE(w.OnLate(c));
  EXPECT_EQ(w.window(), 32u);
}

TEST(CongestionWindowTest, ReorderSlackGrowsToFourTimesTheConfigured) {
  CongestionWindow w(Opts(64, 2, 100));
  for (int i = 0; i < 20; ++i) {
    const uint64_t s = w.Stamp();
    ASSERT_TRUE(w.OnLoss(s));
    w.OnLate(s);
  }
  EXPECT_EQ(w.reorder(), 32u);
}

TEST(CongestionWindowTest, AnyOfTheRecentCutsCanBeUndone) {
  CongestionWindow w(Opts(64, 2, 100));
  const uint64_t a = w.Stamp();
  ASSERT_TRUE(w.OnLoss(a));  // 64 -> 32
  const uint64_t b = w.Stamp();
  ASSERT_TRUE(w.OnLoss(b));  // 32 -> 16
  EXPECT_EQ(w.window(), 16u);
  EXPECT_TRUE(w.OnLate(a));  // the older cut: one halving back
  EXPECT_EQ(w.window(), 32u);
  EXPECT_TRUE(w.OnLate(b));  // never above the window before that cut
  EXPECT_EQ(w.window(), 32u);
  EXPECT_EQ(w.undone(), 2u);
}

TEST(CongestionWindowTest, ACutLeavesTheConfiguredShareAndItsUndoRestoresTheWindow) {
  CongestionOptions o = Opts(100, 4, 200);
  o.decrease = 0.35;
  CongestionWindow w(o);
  const uint64_t a = w.Stamp();
  ASSERT_EQ(w.window(), 100u);
  EXPECT_TRUE(w.OnLoss(a));
  EXPECT_EQ(w.window(), 35u);
  EXPECT_TRUE(w.OnLate(a));
  EXPECT_EQ(w.window(), 100u);  // all of it back, not just twice the cut window
}

CongestionOptions Undoing(uint32_t initial, uint32_t min, uint32_t max) {
  CongestionOptions o = Opts(initial, min, max);
  o.undo_threshold = true;
  return o;
}

TEST(CongestionWindowTest, WithEveryCutUndoneTheWindowSlowStartsAgain) {
  CongestionWindow w(Undoing(16, 2, 100));
  const uint64_t a = w.Stamp();
  ASSERT_TRUE(w.OnLoss(a));
  EXPECT_EQ(w.window(), 8u);
  EXPECT_TRUE(w.OnLate(a));
  EXPECT_EQ(w.window(), 16u);
  w.OnAcked(16);  // doubling, as before the cut: not one more per window
  EXPECT_EQ(w.window(), 32u);
}

TEST(CongestionWindowTest, TheThresholdComesBackOnlyOnceNoLaterCutStands) {
  CongestionWindow w(Undoing(16, 2, 100));
  const uint64_t a = w.Stamp();
  ASSERT_TRUE(w.OnLoss(a));  // 16 -> 8
  const uint64_t b = w.Stamp();
  ASSERT_TRUE(w.OnLoss(b));  // 8 -> 4
  EXPECT_TRUE(w.OnLate(a));  // b still stands: the window back to 8, growing one per window
  EXPECT_EQ(w.window(), 8u);
  w.OnAcked(8);
  EXPECT_EQ(w.window(), 8u);  // 8 + 8 * (about 1/8): not yet 9
  w.OnAcked(1);
  EXPECT_EQ(w.window(), 9u);
  EXPECT_TRUE(w.OnLate(b));  // none stands now: the threshold before a
  EXPECT_EQ(w.window(), 9u);
  w.OnAcked(9);
  EXPECT_EQ(w.window(), 18u);
}

TEST(CongestionWindowTest, ASilenceWithNoneToBlameKeepsItsThreshold) {
  CongestionWindow w(Undoing(16, 2, 100));
  const uint64_t a = w.Stamp();
  ASSERT_TRUE(w.OnLoss(a));  // 16 -> 8
  w.OnSilence(0);            // 8 -> 4, for good
  EXPECT_TRUE(w.OnLate(a));
  EXPECT_EQ(w.window(), 8u);
  w.OnAcked(4);
  EXPECT_EQ(w.window(), 8u);  // one per window, below 9
}

TEST(CongestionWindowTest, WithoutUndoThresholdAnUndoneWindowGrowsOnePerWindow) {
  CongestionWindow w(Opts(16, 2, 100));
  const uint64_t a = w.Stamp();
  ASSERT_TRUE(w.OnLoss(a));
  ASSERT_TRUE(w.OnLate(a));
  EXPECT_EQ(w.window(), 16u);
  w.OnAcked(16);
  EXPECT_EQ(w.window(), 16u);  // 16 + about 1, short of 17
  w.OnAcked(1);
  EXPECT_EQ(w.window(), 17u);
}

}  // namespace
}  // namespace dlcp
