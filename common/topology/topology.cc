#include "common/topology/topology.h"

namespace dlcp {
namespace {
uint64_t Mix(uint64_t x) {  // splitmix64 finalizer
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}
}  // namespace

uint64_t StableHash64(uint64_t a, uint64_t b) { return Mix(Mix(a) ^ (b * 0xC2B2AE3D27D4EB4FULL)); }

uint64_t StableHashString(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ULL;  // FNV-1a, then mixed
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ULL;
  return Mix(h);
}

Topology::Topology(std::vector<Aggregator> aggregators) : aggregators_(std::move(aggregators)) {
  for (const auto& a : aggregators_) seeds_.push_back(StableHashString(a.id));
}

Topology::Owner Topology::OwnerOfBlock(uint32_t job, uint32_t key, uint32_t block) const {
  const uint64_t item = StableHash64((static_cast<uint64_t>(job) << 32) | key, block);
  Owner best;
  uint64_t best_score = 0;
  for (uint32_t i = 0; i < aggregators_.size(); ++i) {
    uint64_t score = StableHash64(item, seeds_[i]);
    if (i == 0 || score > best_score) {
      best_score = score;
      best.aggregator = i;
    }
  }
  uint32_t n = aggregators_.empty() ? 1 : aggregators_[best.aggregator].endpoints;
  best.endpoint = static_cast<uint32_t>(Mix(item) % (n == 0 ? 1 : n));
  return best;
}

}  // namespace dlcp
