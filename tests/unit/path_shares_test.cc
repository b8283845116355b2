#include "common/datapath/path_shares.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

namespace dlcp {
namespace {

// One batch over a fabric whose paths each deliver at most `capacity[p]` datagrams of it; the
// rest of what a path carried is lost and reported. Returns the datagrams lost.
uint32_t Batch(PathShares& s, uint32_t n, const std::vector<uint32_t>& capacity, std::vector<uint32_t>* sent_out) {
  std::vector<uint32_t> sent(s.paths(), 0);
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t p = s.Pick();
    s.OnSent(p);
    ++sent[p];
  }
  uint32_t lost = 0;
  for (uint32_t p = 0; p < s.paths(); ++p) {
    for (uint32_t k = capacity[p]; k < sent[p]; ++k, ++lost) s.OnLost(p);
  }
  EXPECT_TRUE(s.Update());
  if (sent_out != nullptr) *sent_out = sent;
  return lost;
}

TEST(PathSharesTest, NothingLostKeepsEqualSharesInRunsOfTheBurst) {
  PathShares s(4, 2);
  std::vector<uint32_t> order;
  for (int batch = 0; batch < 5; ++batch) {
    for (int i = 0; i < 80; ++i) {
      order.push_back(s.Pick());
      s.OnSent(order.back());
    }
    ASSERT_TRUE(s.Update());
  }
  std::map<uint32_t, int> sent;
  for (uint32_t p : order) ++sent[p];
  ASSERT_EQ(sent.size(), 4u);
  for (auto& [p, n] : sent) EXPECT_EQ(n, 100) << "path " << p;
  for (size_t i = 0; i + 1 < order.size(); i += 2) EXPECT_EQ(order[i], order[i + 1]) << "a run broken at " << i;
  for (uint32_t p = 0; p < 4; ++p) EXPECT_DOUBLE_EQ(s.weight(p), 1.0);
}

// One spine at half the rate of the other: equal turns overrun it (a sixth of everything is lost
// there); the shares move to what each path carries, and the losses stop.
TEST(PathSharesTest, ASlowPathGetsTheShareItCanCarry) {
  PathShares s(2, 1);
  const std::vector<uint32_t> capacity = {100, 200};
  std::vector<uint32_t> sent;
  const uint32_t first = Batch(s, 300, capacity, &sent);
  EXPECT_EQ(first, 50u);
  uint32_t last = first;
  for (int batch = 0; batch < 15; ++batch) last = Batch(s, 300, capacity, &sent);
  EXPECT_LT(s.weight(0), 0.7);
  EXPECT_DOUBLE_EQ(s.weight(1), 1.0);
  EXPECT_LE(last, 15u) << "path 0 carried " << sent[0] << ", path 1 " << sent[1];
  EXPECT_GE(sent[0], 80u) << "the slow path is still probed";
}

// The slow path recovers: the fast one now loses what it cannot carry, and the shares level out.
TEST(PathSharesTest, APathThatStopsLosingWinsItsShareBack) {
  PathShares s(2, 1);
  std::vector<uint32_t> sent;
  for (int batch = 0; batch < 15; ++batch) Batch(s, 300, {100, 200}, &sent);
  ASSERT_LT(s.weight(0), 0.7);
  for (int batch = 0; batch < 30; ++batch) Batch(s, 300, {150, 150}, &sent);
  EXPECT_GT(s.weight(0), 0.85);
  EXPECT_GE(sent[0], 135u);
  EXPECT_GE(sent[1], 135u);
}

TEST(PathSharesTest, APathThatLosesEverythingIsStillProbed) {
  PathShares s(2, 1);
  for (int batch = 0; batch < 40; ++batch) Batch(s, 200, {0, 1000}, nullptr);
  EXPECT_DOUBLE_EQ(s.weight(0), PathShares::kMinWeight);
  std::vector<uint32_t> sent;
  Batch(s, 200, {0, 1000}, &sent);
  EXPECT_GE(sent[0], 4u);
}

// A batch too small to judge is pooled with the next: its losses still count.
TEST(PathSharesTest, SmallBatchesArePooled) {
  PathShares s(2, 1);
  for (int i = 0; i < 20; ++i) s.OnSent(static_cast<uint32_t>(i % 2));
  for (int i = 0; i < 5; ++i) s.OnLost(0);
  EXPECT_FALSE(s.Update());
  EXPECT_DOUBLE_EQ(s.weight(0), 1.0);
  for (int i = 0; i < 20; ++i) s.OnSent(static_cast<uint32_t>(i % 2));
  ASSERT_TRUE(s.Update());
  EXPECT_EQ(s.updates(), 1u);
  // Path 0 delivered 15 of 20, path 1 all 20: (0.75 / 1)^16 would leave path 0 a hundredth of
  // path 1's weight; it falls by half, the most one batch may take, then drifts.
  EXPECT_NEAR(s.weight(0), PathShares::kMaxCut + PathShares::kDrift * (1 - PathShares::kMaxCut), 1e-9);
  EXPECT_DOUBLE_EQ(s.weight(1), 1.0);
}

// Sends `n` datagrams in turn over two paths, loses `lost0` of path 0's and `lost1` of path 1's,
// and weighs the batch.
void Turns(PathShares& s, uint32_t n, uint32_t lost0, uint32_t lost1) {
  for (uint32_t i = 0; i < n; ++i) s.OnSent(i % 2);
  for (uint32_t i = 0; i < lost0; ++i) s.OnLost(0);
  for (uint32_t i = 0; i < lost1; ++i) s.OnLost(1);
  ASSERT_TRUE(s.Update());
}

// A path is cut by the ratio of delivered fractions to the power of the gain, which starts at its
// largest: one loss in 100 more than the other path's.
TEST(PathSharesTest, TheFirstLossyBatchIsWeighedAtTheLargestGain) {
  PathShares s(2, 1);
  EXPECT_DOUBLE_EQ(s.gain(), PathShares::kMaxGain);
  Turns(s, 200, 1, 0);
  const double cut = std::pow(0.99, PathShares::kMaxGain);
  EXPECT_NEAR(s.weight(0), cut + PathShares::kDrift * (1 - cut), 1e-9);
  EXPECT_DOUBLE_EQ(s.weight(1), 1.0);
}

// Batches that blame the paths in turn halve the gain down to its floor; batches that keep
// blaming the same path double it back. A batch without loss changes neither.
TEST(PathSharesTest, TheGainFallsWhileBatchesDisagreeAndRisesWhileTheyAgree) {
  PathShares s(2, 1);
  Turns(s, 200, 1, 0);
  EXPECT_DOUBLE_EQ(s.gain(), 16);
  std::vector<double> gains;
  for (int k = 0; k < 4; ++k) {
    Turns(s, 200, k % 2 == 0 ? 0 : 1, k % 2 == 0 ? 1 : 0);
    gains.push_back(s.gain());
  }
  EXPECT_EQ(gains, (std::vector<double>{8, 4, 2, 2}));
  Turns(s, 200, 0, 0);
  EXPECT_DOUBLE_EQ(s.gain(), 2);
  gains.clear();
  for (int k = 0; k < 4; ++k) {
    Turns(s, 200, 1, 0);  // after path 0's last loss: they agree
    gains.push_back(s.gain());
  }
  EXPECT_EQ(gains, (std::vector<double>{4, 8, 16, 16}));
}

}  // namespace
}  // namespace dlcp
