// Which of several paths the next datagram takes, given each path's weight: smooth weighted round
// robin (nginx's), in runs of `burst` datagrams. Over a cycle every path sends in proportion to
// its weight, interleaved rather than in one block, and a run stays on one path so that the
// transport can hand it to the kernel as one send (UDP GSO).
//
// Single-threaded: owned by one I/O thread. Never blocks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace dlcp {

class WeightedTurns {
 public:
  WeightedTurns(uint32_t paths, uint32_t burst) : credit_(paths, 0.0), burst_(std::max<uint32_t>(1, burst)) {
    run_ = burst_;  // the first Pick chooses
  }

  // True while the current run goes on: the next Pick returns the same path without reading
  // its weights, so callers need not compute them.
  bool InRun() const { return run_ < burst_; }

  // `weights` has one entry per path, none negative and at least one positive.
  uint32_t Pick(absl::Span<const double> weights) {
    if (run_ < burst_) {
      ++run_;
      return current_;
    }
    // Every path earns its weight; the richest sends and pays the total.
    double total = 0;
    uint32_t best = 0;
    for (uint32_t p = 0; p < credit_.size(); ++p) {
      total += weights[p];
      credit_[p] += weights[p];
      if (credit_[p] > credit_[best]) best = p;
    }
    credit_[best] -= total;
    current_ = best;
    run_ = 1;
    return current_;
  }

 private:
  std::vector<double> credit_;
  uint32_t burst_;
  uint32_t current_ = 0;
  uint32_t run_ = 0;  // datagrams sent in the current run
};

}  // namespace dlcp
