#include "common/topology/topology.h"

#include <algorithm>
#include <utility>

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

uint64_t Topology::Item(uint32_t job, uint32_t key, uint32_t block) {
  return StableHash64((static_cast<uint64_t>(job) << 32) | key, block);
}

uint32_t Topology::EndpointOf(uint32_t aggregator, uint64_t item) const {
  const uint32_t n = aggregators_.empty() ? 1 : aggregators_[aggregator].endpoints;
  return static_cast<uint32_t>(Mix(item) % (n == 0 ? 1 : n));
}

std::vector<Topology::Owner> Topology::OwnersOfTensor(uint32_t job, uint32_t key, uint32_t blocks) const {
  std::vector<Owner> owners(blocks);
  const uint32_t n = static_cast<uint32_t>(aggregators_.size());
  if (n == 0) return owners;
  const uint32_t cap = (blocks + n - 1) / n;
  std::vector<uint32_t> load(n, 0);
  std::vector<std::pair<uint64_t, uint32_t>> ranked(n);  // (score, aggregator), best first
  for (uint32_t b = 0; b < blocks; ++b) {
    const uint64_t item = Item(job, key, b);
    for (uint32_t i = 0; i < n; ++i) ranked[i] = {StableHash64(item, seeds_[i]), i};
    // Ties (never seen in 64 bits, but possible) go to the lower index.
    std::sort(ranked.begin(), ranked.end(),
              [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
    for (const auto& [score, i] : ranked) {
      if (load[i] < cap) {
        ++load[i];
        owners[b] = Owner{i, EndpointOf(i, item)};
        break;
      }
    }
  }
  return owners;
}

}  // namespace dlcp
