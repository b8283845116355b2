// Accumulator memory for one data thread: fixed-size blocks of kBlockChunks chunks, reused across
// rounds so the steady state does no allocation and takes no page faults. Owned by one thread.
// Under AddressSanitizer a cached block is poisoned, so a read through a pointer kept past Put
// (a result still queued for sending, say) is reported as a use after free would be.
#pragma once

#include <cstddef>
#include <map>
#include <vector>

namespace dlcp::server {

class BlockPool {
 public:
  explicit BlockPool(size_t max_cached_bytes) : max_cached_bytes_(max_cached_bytes) {}
  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  float* Get(size_t bytes);  // nullptr when out of memory
  void Put(float* block, size_t bytes);
  void Clear();  // frees every cached block
  size_t cached_bytes() const { return cached_bytes_; }

 private:
  size_t max_cached_bytes_;
  size_t cached_bytes_ = 0;
  std::map<size_t, std::vector<float*>> free_;
};

}  // namespace dlcp::server
