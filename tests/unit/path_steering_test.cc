#include "common/datapath/path_steering.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

namespace dlcp {
namespace {

CongestionOptions Opts() {
  CongestionOptions o;
  o.initial = 16;
  o.min = 1;
  o.max = 64;
  return o;
}

std::map<uint32_t, int> Count(PathSteering& s, int n, uint64_t* stamp) {
  std::map<uint32_t, int> sent;
  for (int i = 0; i < n; ++i) {
    const uint32_t p = s.Pick();
    s.OnSent(p, ++*stamp);
    ++sent[p];
  }
  return sent;
}

TEST(PathSteeringTest, EqualPathsShareEquallyInRunsOfTheBurst) {
  PathSteering s(4, 3, Opts());
  std::vector<uint32_t> order;
  for (int i = 0; i < 120; ++i) order.push_back(s.Pick());
  std::map<uint32_t, int> sent;
  for (uint32_t p : order) ++sent[p];
  ASSERT_EQ(sent.size(), 4u);
  for (auto& [p, n] : sent) EXPECT_EQ(n, 30) << "path " << p;
  for (size_t i = 0; i < order.size(); i += 3) {
    EXPECT_EQ(order[i], order[i + 1]);
    EXPECT_EQ(order[i], order[i + 2]);
    if (i + 3 < order.size()) {
      EXPECT_NE(order[i], order[i + 3]) << "a run longer than the burst at " << i;
    }
  }
}

TEST(PathSteeringTest, ALossyPathGetsASmallerShareAndIsProbedAgain) {
  PathSteering s(2, 1, Opts());
  uint64_t stamp = 0;
  Count(s, 10, &stamp);
  // Path 1 loses one datagram per congestion event, three events: its weight falls to 2.
  for (int i = 0; i < 3; ++i) {
    s.OnLoss(1, stamp);
    Count(s, 2, &stamp);
  }
  EXPECT_EQ(s.weight(0), 16u);
  EXPECT_EQ(s.weight(1), 2u);
  std::map<uint32_t, int> sent = Count(s, 180, &stamp);
  EXPECT_EQ(sent[0], 160);  // 16 : 2
  EXPECT_EQ(sent[1], 20);
  // Its datagrams get through again: its window (one more per window's worth) and its share
  // grow back.
  for (int i = 0; i < 200; ++i) s.OnAcked(1);
  EXPECT_EQ(s.weight(1), 20u);
  sent = Count(s, 180, &stamp);
  EXPECT_GE(sent[1], 90);
}

TEST(PathSteeringTest, ALateDatagramRestoresItsPathsShare) {
  PathSteering s(2, 1, Opts());
  uint64_t stamp = 0;
  Count(s, 4, &stamp);
  s.OnLoss(0, 3);
  EXPECT_EQ(s.weight(0), 8u);
  s.OnLate(0, 3);
  EXPECT_EQ(s.weight(0), 16u);
}

TEST(PathSteeringTest, OnePathAlwaysPicksIt) {
  PathSteering s(1, 8, Opts());
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.Pick(), 0u);
}

}  // namespace
}  // namespace dlcp
