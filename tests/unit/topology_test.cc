#include <gtest/gtest.h>

#include <map>

#include "common/topology/topology.h"

namespace dlcp {
namespace {

Topology Make(int n, uint32_t endpoints = 1) {
  std::vector<Topology::Aggregator> aggs;
  for (int i = 0; i < n; ++i) aggs.push_back({"10.0.0." + std::to_string(i) + ":7400", endpoints});
  return Topology(aggs);
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
  Topology t1(aggs);
  std::reverse(aggs.begin(), aggs.end());
  Topology t2(aggs);
  for (uint32_t b = 0; b < 1000; ++b) {
    EXPECT_EQ(t1.aggregators()[t1.OwnerOfBlock(1, 2, b).aggregator].id,
              t2.aggregators()[t2.OwnerOfBlock(1, 2, b).aggregator].id);
  }
}

TEST(Topology, RemovingOneAggregatorMovesOnlyItsShare) {
  Topology four = Make(4);
  std::vector<Topology::Aggregator> three_aggs(four.aggregators().begin(), four.aggregators().begin() + 3);
  Topology three(three_aggs);
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

// With one aggregator per node, node i sends its worker's chunks owned elsewhere plus its
// aggregator's results to the other N-1 workers, and receives the mirror image. Balanced shares
// make that 2·S·(N−1)/N each way, what ring all-reduce moves.
TEST(Topology, OneAggregatorPerNodeMovesRingAllReduceBytes) {
  for (int n : {2, 4, 8}) {
    Topology t = Make(n);
    const uint64_t chunk_bytes = 8192, tensor_bytes = 100ull << 20, tensors = 8;
    const uint32_t chunks = tensor_bytes / chunk_bytes;
    std::vector<double> owned(n, 0);  // bytes per round owned by each node's aggregator
    for (uint32_t key = 0; key < tensors; ++key) {
      for (uint32_t c = 0; c < chunks; ++c) owned[t.OwnerOfChunk(7, key, c).aggregator] += chunk_bytes;
    }
    const double s = static_cast<double>(tensor_bytes * tensors);
    const double ring = 2.0 * s * (n - 1) / n;
    for (int i = 0; i < n; ++i) {
      double sent = (s - owned[i]) + owned[i] * (n - 1);      // pushes out + results out
      double received = owned[i] * (n - 1) + (s - owned[i]);  // pushes in + results in
      EXPECT_NEAR(sent, ring, ring * 0.05) << "n=" << n << " node " << i;
      EXPECT_NEAR(received, ring, ring * 0.05) << "n=" << n << " node " << i;
    }
  }
}

}  // namespace
}  // namespace dlcp
