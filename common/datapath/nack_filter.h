// Whether a push that an aggregator asks for again is known to be lost, or may still be on its
// way. Strict priority starves the less important classes while the others flow, so a push can
// wait in its class's queue far longer than the aggregator's quiet spell: NACKed then, its repair
// (class 0) overtakes it, and both get through, one of them for nothing. On the two-spine test
// bed with jumbo frames, three in four duplicate pushes were such originals.
//
// A push is known lost once a result came back for a push sent after it on the same path in the
// same class: each switch queue is FIFO, and ECMP pins a source port to one path. The caller
// answers a NACK for a push not known lost only when it comes again, which bounds the wait by
// one repair interval of the aggregator. (A patience derived from result latency instead fed on
// itself: deferred repairs made rounds longer, which made the patience longer.)
//
// Single-threaded: one per aggregator endpoint, owned by the I/O thread. Never blocks.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "common/wire/header.h"

namespace dlcp {

class NackFilter {
 public:
  explicit NackFilter(uint32_t paths = 1) : delivered_(paths == 0 ? 1 : paths) {}

  // A result came back for a push sent once, with `stamp` (the endpoint window's), on `path`, in
  // class `cls`.
  void OnDelivered(uint32_t path, uint8_t cls, uint64_t stamp) {
    if (cls >= wire::kNumClasses) return;
    uint64_t& newest = delivered_[Path(path)][cls];
    if (stamp > newest) newest = stamp;
  }
  // Whether a chunk pushed once with `stamp` on `path` in `cls` is known to be lost.
  bool KnownLost(uint32_t path, uint8_t cls, uint64_t stamp) const {
    return cls < wire::kNumClasses && delivered_[Path(path)][cls] > stamp;
  }

 private:
  uint32_t Path(uint32_t path) const { return path < delivered_.size() ? path : 0; }
  std::vector<std::array<uint64_t, wire::kNumClasses>> delivered_;  // newest stamp answered
};

}  // namespace dlcp
