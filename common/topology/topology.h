// Which aggregator, and which of its data endpoints, owns each chunk of a tensor.
// Chunks are grouped in blocks of kBlockChunks. Each block prefers aggregators in the order of
// their rendezvous (HRW) scores for (job, key, block), and goes to the first one in that order
// that holds fewer than its share of the tensor's blocks (bounded-load rendezvous hashing).
// Shares must be even within each tensor: with one aggregator per node, node k's link carries
// S + 2·s_k per round for a tensor of S bytes of which its aggregator owns s_k, so the largest
// share sets the round time. Plain HRW over the 40 blocks of a 20 MiB tensor (8 KiB chunks)
// gave one aggregator twice another's share. A tensor of one block, and so the many small
// tensors of a model, still goes to its first choice, and removing one aggregator moves little
// more than its share. Immutable after construction; safe to share.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dlcp {

inline constexpr uint32_t kBlockChunks = 64;

// Stable across processes, builds and hosts (unlike std::hash).
uint64_t StableHash64(uint64_t a, uint64_t b);
uint64_t StableHashString(const std::string& s);

class Topology {
 public:
  struct Aggregator {
    std::string id;            // the control address, identical on every worker
    uint32_t endpoints = 1;    // data endpoints (one per data thread)
  };
  struct Owner {
    uint32_t aggregator = 0;   // index into aggregators()
    uint32_t endpoint = 0;     // index into that aggregator's endpoints
    bool operator==(const Owner&) const = default;
  };

  explicit Topology(std::vector<Aggregator> aggregators);

  const std::vector<Aggregator>& aggregators() const { return aggregators_; }
  // The owner of every block of a tensor of `blocks` blocks: no aggregator holds more than
  // ceil(blocks / aggregators) of them.
  std::vector<Owner> OwnersOfTensor(uint32_t job, uint32_t key, uint32_t blocks) const;

 private:
  std::vector<Aggregator> aggregators_;
  std::vector<uint64_t> seeds_;
  static uint64_t Item(uint32_t job, uint32_t key, uint32_t block);
  uint32_t EndpointOf(uint32_t aggregator, uint64_t item) const;
};

}  // namespace dlcp
