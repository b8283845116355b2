// Which aggregator, and which of its data endpoints, owns each chunk of a tensor.
// Chunks are grouped in blocks of kBlockChunks; each block goes to the aggregator with the highest
// rendezvous (HRW) score for (job, key, block). That spreads load evenly, and adding or removing
// one aggregator moves only that aggregator's share. Immutable after construction; safe to share.
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
  Owner OwnerOfBlock(uint32_t job, uint32_t key, uint32_t block) const;
  Owner OwnerOfChunk(uint32_t job, uint32_t key, uint32_t chunk) const {
    return OwnerOfBlock(job, key, chunk / kBlockChunks);
  }

 private:
  std::vector<Aggregator> aggregators_;
  std::vector<uint64_t> seeds_;
};

}  // namespace dlcp
