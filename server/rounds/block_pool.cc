#include "server/rounds/block_pool.h"

#include <cstdlib>

#include "common/base/sanitizers.h"

namespace dlcp::server {

BlockPool::~BlockPool() { Clear(); }

void BlockPool::Clear() {
  for (auto& [bytes, list] : free_) {
    for (float* b : list) {
      DLCP_UNPOISON_MEMORY(b, bytes);
      std::free(b);
    }
  }
  free_.clear();
  cached_bytes_ = 0;
}

float* BlockPool::Get(size_t bytes) {
  auto it = free_.find(bytes);
  if (it != free_.end() && !it->second.empty()) {
    float* b = it->second.back();
    it->second.pop_back();
    cached_bytes_ -= bytes;
    DLCP_UNPOISON_MEMORY(b, bytes);
    return b;
  }
  return static_cast<float*>(std::aligned_alloc(64, (bytes + 63) & ~size_t{63}));
}

void BlockPool::Put(float* block, size_t bytes) {
  if (cached_bytes_ + bytes > max_cached_bytes_) {
    std::free(block);
    return;
  }
  DLCP_POISON_MEMORY(block, bytes);
  free_[bytes].push_back(block);
  cached_bytes_ += bytes;
}

}  // namespace dlcp::server
