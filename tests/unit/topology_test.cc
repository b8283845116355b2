#include "common/topology/topology.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

namespace dlcp {
namespace {

Topology Make(int n, uint32_t endpoints = 1) {
  std::vector<Topology::Aggregator> aggs;
  for (int i = 0; i < n; ++i) aggs.push_back({"10.0.0." + std::to_string(i) + ":7400", endpoints});
  return Topology(aggs);
}

std::vector<uint32_t> Loads(const std::vector<Topology::Owner>& owners, int n) {
  std::vector<uint32_t> load(n, 0);
  for (const Topology::Owner& o : owners) ++load[o.aggregator];
  return load;
}

TEST(Topology, SpreadsBlocksEvenly) {
  Topology t = Make(4, 2);
  std::map<std::pair<uint32_t, uint32_t>, int> load;
  const int blocks = 40000;
  for (uint32_t key = 0; key < 10; ++key) {
    for (const Topology::Owner& o : t.OwnersOfTensor(42, key, blocks / 10)) load[{o.aggregator, o.endpoint}]++;
  }
  ASSERT_EQ(load.size(), 8u);
  for (auto& [owner, n] : load) {
    EXPECT_NEAR(n, blocks / 8, blocks / 8 * 0.06) << owner.first << "/" << owner.second;
  }
}

// Every tensor on its own: the largest share sets the round time (topology.h), and rendezvous
// hashing alone leaves it to chance: 40 blocks over 4 aggregators came out 7/10/14/9.
TEST(Topology, NoAggregatorHoldsMoreThanItsShareOfATensor) {
  for (int n : {2, 3, 4, 5, 8}) {
    Topology t = Make(n);
    for (uint32_t blocks : {1u, 2u, 7u, 40u, 41u, 234u, 1000u}) {
      for (uint32_t key = 0; key < 20; ++key) {
        std::vector<uint32_t> load = Loads(t.OwnersOfTensor(3, key, blocks), n);
        const uint32_t cap = (blocks + n - 1) / n;
        EXPECT_LE(*std::max_element(load.begin(), load.end()), cap) << n << " aggregators, " << blocks << " blocks";
        uint32_t total = 0;
        for (uint32_t l : load) total += l;
        EXPECT_EQ(total, blocks);
      }
    }
  }
}

// A one-block tensor goes to its first choice by rendezvous hashing, so removing any other
// aggregator leaves it where it is, and many small tensors spread by their keys alone.
TEST(Topology, AOneBlockTensorStaysWhenAnotherAggregatorLeaves) {
  Topology five = Make(5, 3);
  std::vector<uint32_t> load(5, 0);
  for (uint32_t key = 0; key < 5000; ++key) {
    std::vector<Topology::Owner> owners = five.OwnersOfTensor(9, key, 1);
    ASSERT_EQ(owners.size(), 1u);
    ++load[owners[0].aggregator];
    const uint32_t gone = (owners[0].aggregator + 1 + key % 4) % 5;
    std::vector<Topology::Aggregator> rest;
    for (uint32_t i = 0; i < 5; ++i) {
      if (i != gone) rest.push_back(five.aggregators()[i]);
    }
    Topology four(rest);
    const Topology::Owner after = four.OwnersOfTensor(9, key, 1)[0];
    EXPECT_EQ(four.aggregators()[after.aggregator].id, five.aggregators()[owners[0].aggregator].id) << key;
    EXPECT_EQ(after.endpoint, owners[0].endpoint) << key;
  }
  for (uint32_t l : load) EXPECT_NEAR(l, 1000, 100);
}

TEST(Topology, IsDeterministicAndOrderIndependent) {
  std::vector<Topology::Aggregator> aggs = {{"a:1", 1}, {"b:1", 1}, {"c:1", 1}};
  Topology t1(aggs);
  std::reverse(aggs.begin(), aggs.end());
  Topology t2(aggs);
  std::vector<Topology::Owner> o1 = t1.OwnersOfTensor(1, 2, 1000), o2 = t2.OwnersOfTensor(1, 2, 1000);
  for (uint32_t b = 0; b < 1000; ++b) {
    EXPECT_EQ(t1.aggregators()[o1[b].aggregator].id, t2.aggregators()[o2[b].aggregator].id);
  }
}

TEST(Topology, RemovingOneAggregatorMovesLittleMoreThanItsShare) {
  Topology four = Make(4);
  std::vector<Topology::Aggregator> three_aggs(four.aggregators().begin(), four.aggregators().begin() + 3);
  Topology three(three_aggs);
  uint32_t moved = 0, survivors_moved = 0;
  const uint32_t blocks = 10000;
  std::vector<Topology::Owner> before = four.OwnersOfTensor(5, 5, blocks), after = three.OwnersOfTensor(5, 5, blocks);
  for (uint32_t b = 0; b < blocks; ++b) {
    if (before[b].aggregator == 3) {
      ++moved;
    } else if (before[b].aggregator != after[b].aggregator) {
      ++survivors_moved;
    }
  }
  EXPECT_EQ(moved, blocks / 4);
  // Its blocks fill the survivors' new shares, which pushes some of their own blocks along.
  EXPECT_LT(survivors_moved, blocks / 5) << survivors_moved;
}

// With one aggregator per node, node i sends its worker's chunks owned elsewhere plus its
// aggregator's results to the other N-1 workers, and receives the mirror image. Even shares make
// that 2·S·(N−1)/N each way, what ring all-reduce moves, for every tensor by itself: here one of
// 20 MiB. No node carries more than one block's worth beyond that (a node with a smaller share
// carries less, and is not the one the round waits for).
TEST(Topology, OneAggregatorPerNodeMovesRingAllReduceBytes) {
  for (int n : {2, 4, 8}) {
    for (uint64_t chunk_bytes : {1400u, 8192u}) {
      Topology t = Make(n);
      const uint64_t tensor_bytes = 20ull << 20;
      const uint32_t chunks = static_cast<uint32_t>((tensor_bytes + chunk_bytes - 1) / chunk_bytes);
      const uint32_t blocks = (chunks + kBlockChunks - 1) / kBlockChunks;
      std::vector<double> owned(n, 0);  // bytes per round owned by each node's aggregator
      std::vector<Topology::Owner> owners = t.OwnersOfTensor(7, 1, blocks);
      for (uint32_t c = 0; c < chunks; ++c) owned[owners[c / kBlockChunks].aggregator] += chunk_bytes;
      const double s = static_cast<double>(chunks * chunk_bytes);
      const double ring = 2.0 * s * (n - 1) / n;
      const double block = static_cast<double>(kBlockChunks * chunk_bytes) * (n - 2);  // one block more or less
      for (int i = 0; i < n; ++i) {
        double sent = (s - owned[i]) + owned[i] * (n - 1);      // pushes out + results out
        double received = owned[i] * (n - 1) + (s - owned[i]);  // pushes in + results in
        EXPECT_LE(sent, ring + block + 1) << "n=" << n << " node " << i << " chunk " << chunk_bytes;
        EXPECT_LE(received, ring + block + 1) << "n=" << n << " node " << i << " chunk " << chunk_bytes;
      }
    }
  }
}

}  // namespace
}  // namespace dlcp
