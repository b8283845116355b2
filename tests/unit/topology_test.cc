#include <gtest/gtest.h>

#include <map>

#include "common/topology/topology.h"

namespace dlcp {
namespace {

Topology Make(int n, uint32_t endpoints = 1) {
  std::vector<Topology::Aggregator> aggs;
  for (int i = 0; i < n; ++i) aggs.push_back({"10.0.0." + std::to_string(i) + ":7400", endpoints});
  return Topology(1, aggs);
}

TEST(Topology, SpreadsBlocksEvenly) {
  Topology t = Make(4, 2);
  std::map<std::pair<uint32_t, uint32_t>, int> load;
  const int blocks = 40000;
  for (int b = 0; b < blocks; ++b) {
    Topology::Owner o = t.OwnerOfBlock(42, b % 10, b / 10);
    load[{o.aggregator, o.endpoint}]++;
  }
  ASSERT_EQ(load.size(), 8u);
  for (auto& [owner, n] : load) {
    EXPECT_NEAR(n, blocks / 8, blocks / 8 * 0.06) << owner.first << "/" << owner.second;
  }
}

TEST(Topology, IsDeterministicAndOrderIndependent) {
  std::vector<Topology::Aggregator> aggs = {{"a:1", 1}, {"b:1", 1}, {"c:1", 1}};
  Topology t1(1, aggs);
  std::reverse(aggs.begin(), aggs.end());
  Topology t2(1, aggs);
  for (uint32_t b = 0; b < 1000; ++b) {
    EXPECT_EQ(t1.aggregators()[t1.OwnerOfBlock(1, 2, b).aggregator].id,
              t2.aggregators()[t2.OwnerOfBlock(1, 2, b).aggregator].id);
  }
}

TEST(Topology, RemovingOneAggregatorMovesOnlyItsShare) {
  Topology four = Make(4);
  std::vector<Topology::Aggregator> three_aggs(four.aggregators().begin(), four.aggregators().begin() + 3);
  Topology three(1, three_aggs);
  int moved = 0;
  for (uint32_t b = 0; b < 10000; ++b) {
    uint32_t before = four.OwnerOfBlock(5, 5, b).aggregator;
    uint32_t after = three.OwnerOfBlock(5, 5, b).aggregator;
    if (before != 3) {
      EXPECT_EQ(before, after);  // survivors keep their blocks
    } else {
      ++moved;
    }
  }
  EXPECT_NEAR(moved, 2500, 250);
}

TEST(Topology, ChunksOfABlockShareAnOwner) {
  Topology t = Make(3);
  for (uint32_t c = 0; c < kBlockChunks; ++c) EXPECT_EQ(t.OwnerOfChunk(1, 1, c), t.OwnerOfChunk(1, 1, 0));
}

}  // namespace
}  // namespace dlcp
