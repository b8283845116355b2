#include "server/rounds/block_pool.h"

#include <cstdlib>

#include "common/base/sanitizers.h"

#if defined(DLCP_UNDER_ASAN)
#include <sanitizer/asan_interface.h>
#define DLCP_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define DLCP_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define DLCP_POISON(p, n) ((void)(p), (void)(n))
#define DLCP_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace dlcp::server {

BlockPool::~BlockPool() { Clear(); }

void BlockPool::Clear() {
  for (auto& [bytes, list] : free_) {
    for (float* b : list) {
      DLCP_UNPOISON(b, bytes);
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
    DLCP_UNPOISON(b, bytes);
    return b;
  }
  return static_cast<float*>(std::aligned_alloc(64, (bytes + 63) & ~size_t{63}));
}

void BlockPool::Put(float* block, size_t bytes) {
  if (cached_bytes_ + bytes > max_cached_bytes_) {
    std::free(block);
    return;
  }
  DLCP_POISON(block, bytes);
  free_[bytes].push_back(block);
  cached_bytes_ += bytes;
}

}  // namespace dlcp::server
