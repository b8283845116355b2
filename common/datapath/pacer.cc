#include "common/datapath/pacer.h"

#include <algorithm>
#include <limits>

namespace dlcp {
namespace {
constexpr uint64_t kMinSampleCount = 4;  // fewer answers say little about a rate
}  // namespace

Pacer::Pacer(const PacerOptions& options) : options_(options) {}

void Pacer::OnDelivered(uint32_t n, absl::Time now) {
  if (n == 0) return;
  // Answers paced slowly come far apart, and must still make samples, or a low rate could never
  // rise again: a gap counts as a pause only when it is also several of the pacer's own gaps.
  const double r = rate();
  const absl::Duration idle = r > 0 ? std::max(options_.idle, absl::Seconds(4 / r)) : options_.idle;
  if (now - last_delivery_ > idle) {
    // The first answer after a pause starts the clock; it says nothing about the pace.
    sample_start_ = now;
    sample_count_ = 0;
    last_delivery_ = now;
    return;
  }
  last_delivery_ = now;
  sample_count_ += n;
  const absl::Duration span = now - sample_start_;
  if (span >= options_.sample && sample_count_ >= kMinSampleCount) {
    samples_[next_sample_] = static_cast<double>(sample_count_) / absl::ToDoubleSeconds(span);
    next_sample_ = (next_sample_ + 1) % samples_.size();
    sample_start_ = now;
    sample_count_ = 0;
  }
}

double Pacer::rate() const { return *std::max_element(samples_.begin(), samples_.end()) * options_.gain; }

uint32_t Pacer::Allowance(absl::Time now) {
  const double r = rate();
  if (r <= 0) return std::numeric_limits<uint32_t>::max();
  const double cap = std::max<double>(options_.burst, r * absl::ToDoubleSeconds(options_.burst_time));
  if (refilled_ == absl::InfinitePast()) {
    tokens_ = cap;
  } else if (now > refilled_) {
    tokens_ = std::min(cap, tokens_ + r * absl::ToDoubleSeconds(now - refilled_));
  }
  refilled_ = std::max(refilled_, now);
  return tokens_ < 1 ? 0 : static_cast<uint32_t>(tokens_);
}

void Pacer::OnSent(uint32_t n) { tokens_ -= n; }

absl::Time Pacer::NextSend(absl::Time now) const {
  const double r = rate();
  if (r <= 0 || tokens_ >= 1) return now;
  return std::max(now, refilled_) + absl::Seconds((1 - tokens_) / r);
}

}  // namespace dlcp
