#include "common/datapath/path_steering.h"

#include <algorithm>

#include "common/base/check.h"

namespace dlcp {

PathSteering::PathSteering(uint32_t paths, uint32_t burst, const CongestionOptions& options)
    : shares_(paths, Share{CongestionWindow(options), 0}), burst_(std::max<uint32_t>(1, burst)) {
  DLCP_CHECK_GE(paths, 1u);
  run_ = burst_;  // the first Pick chooses
}

uint32_t PathSteering::Pick() {
  if (run_ < burst_) {
    ++run_;
    return current_;
  }
  // Every path earns its weight; the richest sends and pays the total. Over a cycle each path
  // sends in proportion to its weight, interleaved rather than in one block.
  double total = 0;
  uint32_t best = 0;
  for (uint32_t p = 0; p < shares_.size(); ++p) {
    const double w = shares_[p].window.window();
    total += w;
    shares_[p].credit += w;
    if (shares_[p].credit > shares_[best].credit) best = p;
  }
  shares_[best].credit -= total;
  current_ = best;
  run_ = 1;
  return current_;
}

}  // namespace dlcp
