#include "common/datapath/congestion_window.h"

#include <algorithm>

namespace dlcp {

namespace {
// The window runs inside trainers, where nothing may abort: options out of range are brought into
// it (max at least 1, min within [1, max], a decrease that shrinks the window), not checked.
CongestionOptions Normalized(CongestionOptions o) {
  o.max = std::max<uint32_t>(o.max, 1);
  o.min = std::clamp<uint32_t>(o.min, 1, o.max);
  if (!(o.decrease > 0.0 && o.decrease < 1.0)) o.decrease = CongestionOptions{}.decrease;
  return o;
}
}  // namespace

CongestionWindow::CongestionWindow(const CongestionOptions& options) : options_(Normalized(options)) {
  cwnd_ = std::clamp(options_.initial, options_.min, options_.max);
  min_reorder_ = std::max<uint64_t>(1, options_.reorder);
  ssthresh_ = options_.max;
}

void CongestionWindow::OnAcked(uint32_t n) {
  for (uint32_t i = 0; i < n && cwnd_ < options_.max; ++i) cwnd_ += cwnd_ < ssthresh_ ? 1.0 : 1.0 / cwnd_;
  cwnd_ = std::min<double>(cwnd_, options_.max);
}

bool CongestionWindow::OnLoss(uint64_t stamp) {
  if (stamp <= recovery_) return false;
  Cut(stamp);
  return true;
}

bool CongestionWindow::OnLate(uint64_t stamp) {
  if (stamp == 0) return false;
  auto it = std::find_if(undo_.begin(), undo_.end(),
                         [&](const Undo& u) { return u.seq != 0 && !u.undone && u.cause == stamp; });
  if (it == undo_.end()) return false;
  // One cut taken back, never past the window before it (it may have grown since).
  cwnd_ = std::max(cwnd_, std::min(it->cwnd, cwnd_ / options_.decrease));
  it->undone = true;
  ssthresh_ = std::max(ssthresh_, cwnd_);
  if (options_.undo_threshold &&
      std::none_of(undo_.begin(), undo_.end(), [&](const Undo& u) { return u.seq > it->seq && !u.undone; })) {
    ssthresh_ = std::max(ssthresh_, ThresholdBefore(*it));
  }
  ++undone_;
  // Spraying reorders by whole bursts (each source port's flow may take another path, or
  // another receive queue): twice the slack each time, up to 4 times the configured one.
  min_reorder_ = std::min<uint64_t>(min_reorder_ * 2, 4 * std::max<uint64_t>(1, options_.reorder));
  return true;
}

// Every cut from the one after the latest still standing through `undone` has been taken back;
// the threshold before the first of them is where the window would be without any.
double CongestionWindow::ThresholdBefore(const Undo& undone) const {
  uint64_t standing = 0;
  for (const Undo& u : undo_) {
    if (u.seq != 0 && !u.undone) standing = std::max(standing, u.seq);
  }
  const Undo* first = &undone;
  for (const Undo& u : undo_) {
    if (u.seq > standing && u.seq < first->seq) first = &u;
  }
  return first->ssthresh;
}

uint64_t CongestionWindow::reorder() const { return min_reorder_; }

void CongestionWindow::OnSilence(uint64_t oldest) { Cut(oldest); }

void CongestionWindow::Cut(uint64_t cause) {
  ++cuts_;
  undo_[next_undo_++ % undo_.size()] = Undo{cuts_, cause, false, cwnd_, ssthresh_};
  cwnd_ = std::max<double>(options_.min, cwnd_ * options_.decrease);
  ssthresh_ = cwnd_;
  recovery_ = sent_;
}

}  // namespace dlcp
