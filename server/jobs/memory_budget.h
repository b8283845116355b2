// The accumulator memory all of an aggregator's jobs may hold at once (dlcpd --max-memory-bytes),
// on top of each job's own budget (--max-job-bytes): what keeps 64 jobs of 4 GiB each inside the
// pod's memory limit. Rounds take a block's bytes before they allocate it and give them back when
// they free it. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>

namespace dlcp::server {

class MemoryBudget {
 public:
  explicit MemoryBudget(uint64_t limit) : limit_(limit) {}

  // Takes `bytes` if they fit under the limit with what is taken; false, taking nothing, if not.
  bool TryTake(uint64_t bytes) {
    uint64_t used = used_.load(std::memory_order_relaxed);
    do {
      if (used + bytes > limit_) return false;
    } while (!used_.compare_exchange_weak(used, used + bytes, std::memory_order_relaxed));
    return true;
  }
  void Give(uint64_t bytes) { used_.fetch_sub(bytes, std::memory_order_relaxed); }

  uint64_t used() const { return used_.load(std::memory_order_relaxed); }
  uint64_t limit() const { return limit_; }

 private:
  const uint64_t limit_;
  std::atomic<uint64_t> used_{0};
};

}  // namespace dlcp::server
