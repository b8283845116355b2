#include "common/datapath/path_shares.h"

#include <algorithm>
#include <cmath>
#include <vector>


namespace dlcp {

PathShares::PathShares(uint32_t paths, uint32_t burst)
    : turns_(std::max<uint32_t>(paths, 1), burst),
      weights_(std::max<uint32_t>(paths, 1), 1.0),
      sent_(std::max<uint32_t>(paths, 1), 0),
      lost_(std::max<uint32_t>(paths, 1), 0) {}

namespace {
// The step of a path that delivered at most kMinWeight of what the paths together did.
const double kDeadStep = std::log(PathShares::kMinWeight);
}  // namespace

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
  if (lost > 0 && delivered > 0) {
    // Each path's step is the log of its delivered fraction over all paths' (0 for a path that
    // sent nothing: it drifts like the rest).
    std::vector<double> step(weights_.size(), 0.0);
    for (uint32_t p = 0; p < weights_.size(); ++p) {
      if (sent_[p] == 0) continue;
      const double ratio = (1.0 - static_cast<double>(lost_[p]) / static_cast<double>(sent_[p])) / delivered;
      // A path that lost everything would step by -inf.
      step[p] = std::max(kDeadStep, std::log(ratio));
    }
    AdaptGain(step);
    // Each path's factor, relative to the best path's: only the ratios between weights matter,
    // and the cap bounds how far a path falls behind the best one in one batch. A path that
    // delivered (next to) nothing is not capped: it drops to the floor at once.
    const double best = *std::max_element(step.begin(), step.end());
    for (uint32_t p = 0; p < weights_.size(); ++p) {
      const double factor = std::exp(gain_ * (step[p] - best));
      weights_[p] *= step[p] <= kDeadStep ? factor : std::max(kMaxCut, factor);
    }
    last_step_ = std::move(step);
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

void PathShares::AdaptGain(const std::vector<double>& step) {
  if (last_step_.empty()) return;
  double dot = 0, a = 0, b = 0;
  for (size_t p = 0; p < step.size(); ++p) {
    dot += step[p] * last_step_[p];
    a += step[p] * step[p];
    b += last_step_[p] * last_step_[p];
  }
  if (a == 0 || b == 0) return;
  const double cosine = dot / std::sqrt(a * b);
  if (cosine > kAgree) {
    gain_ = std::min(kMaxGain, gain_ * 2);
  } else if (cosine < -kAgree) {
    gain_ = std::max(kMinGain, gain_ / 2);
  }
}

}  // namespace dlcp
