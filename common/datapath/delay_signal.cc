#include "common/datapath/delay_signal.h"

#include <algorithm>

namespace dlcp {

DelaySignal::DelaySignal(const DelaySignalOptions& options) : options_(options) {
  options_.recent = std::max<size_t>(1, options_.recent);
  options_.capacity = std::max<size_t>(1, options_.capacity);
  if (!(options_.base_span > absl::ZeroDuration())) options_.base_span = DelaySignalOptions{}.base_span;
  sent_.resize(options_.capacity);
  recent_.assign(options_.recent, absl::InfiniteDuration());
  base_quarters_.fill(absl::InfiniteDuration());
}

void DelaySignal::OnSent(uint64_t stamp, absl::Time now) { sent_[stamp % sent_.size()] = Sent{stamp, now}; }

void DelaySignal::OnAnswered(uint64_t stamp, absl::Time now) {
  Sent& s = sent_[stamp % sent_.size()];
  if (s.stamp != stamp || stamp == 0) return;  // overwritten since, or never recorded
  s.stamp = 0;  // one sample per datagram, whatever answers it later
  const absl::Duration rtt = now - s.at;
  if (rtt < absl::ZeroDuration()) return;
  recent_[samples_++ % recent_.size()] = rtt;
  // Each quarter of the span that ended forgets the oldest quarter's minimum; after a pause longer
  // than the span (between jobs, say), all of them.
  const absl::Duration quarter = options_.base_span / base_quarters_.size();
  if (now - quarter_start_ >= quarter) {
    const int64_t quarters = static_cast<int64_t>(base_quarters_.size());
    const int64_t ended = quarter_start_ == absl::InfinitePast() ? quarters : (now - quarter_start_) / quarter;
    for (int64_t i = 0; i < std::min(ended, quarters); ++i) {
      quarter_ = (quarter_ + 1) % base_quarters_.size();
      base_quarters_[quarter_] = absl::InfiniteDuration();
    }
    quarter_start_ = now;
  }
  base_quarters_[quarter_] = std::min(base_quarters_[quarter_], rtt);
}

absl::Duration DelaySignal::recent() const { return *std::min_element(recent_.begin(), recent_.end()); }

absl::Duration DelaySignal::base() const { return *std::min_element(base_quarters_.begin(), base_quarters_.end()); }

bool DelaySignal::Raised() const {
  if (samples_ < recent_.size()) return true;
  const absl::Duration base_rtt = base();
  return recent() - base_rtt > std::max(options_.floor, options_.ratio * base_rtt);
}

}  // namespace dlcp
