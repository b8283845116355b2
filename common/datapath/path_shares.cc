#include "common/datapath/path_shares.h"

#include <algorithm>

#include "common/base/check.h"

namespace dlcp {

PathShares::PathShares(uint32_t paths, uint32_t burst)
    : turns_(paths, burst), weights_(paths, 1.0), sent_(paths, 0), lost_(paths, 0) {
  DLCP_CHECK_GE(paths, 1u);
}

bool PathShares::Update() {
  uint64_t sent = 0;
  uint64_t lost = 0;
  for (uint32_t p = 0; p < weights_.size(); ++p) {
    // A resend may be reported lost after a batch that counted its first send; never more
    // losses than sends.
    lost_[p] = std::min(lost_[p], sent_[p]);
    sent += sent_[p];
    lost += lost_[p];
  }
  if (sent < uint64_t{kMinBatch} * weights_.size()) return false;
  const double delivered = 1.0 - static_cast<double>(lost) / static_cast<double>(sent);
  if (delivered > 0) {
    for (uint32_t p = 0; p < weights_.size(); ++p) {
      if (sent_[p] == 0) continue;  // nothing learned about it; it drifts like the rest
      const double ratio = (1.0 - static_cast<double>(lost_[p]) / static_cast<double>(sent_[p])) / delivered;
      weights_[p] *= ratio * ratio;
    }
  }
  const double largest = *std::max_element(weights_.begin(), weights_.end());
  for (double& w : weights_) {
    w = largest > 0 ? w / largest : 1.0;
    w = std::max(kMinWeight, w + kDrift * (1.0 - w));
  }
  std::fill(sent_.begin(), sent_.end(), 0);
  std::fill(lost_.begin(), lost_.end(), 0);
  ++updates_;
  return true;
}

}  // namespace dlcp
