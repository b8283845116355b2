// When to log a running count of loss on the host (a receive buffer or queue that overflowed):
// at the first, and again each time the count has doubled. Nothing else names such loss, so it
// must be logged, but a chronic overflow should log a few dozen lines in all, not one per drop.
//
// Single-threaded: owned by the transport's I/O thread.
#pragma once

#include <cstdint>

namespace dlcp {

class DoublingReport {
 public:
  // `total`: the count so far. True when it has reached the next report.
  bool Due(uint64_t total) {
    if (total < next_) return false;
    next_ = 2 * total;
    return true;
  }

 private:
  uint64_t next_ = 1;
};

}  // namespace dlcp
