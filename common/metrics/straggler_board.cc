#include "common/metrics/straggler_board.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

namespace dlcp {

void StragglerBoard::NoteRound(const std::vector<uint32_t>& delivered_us) {
  if (delivered_us.size() != world_ || world_ < 2) return;
  uint32_t first = UINT32_MAX, latest = 0;
  bool missing = false;
  for (uint32_t t : delivered_us) {
    missing |= t == 0;
    if (t == 0) continue;
    first = std::min(first, t);
    latest = std::max(latest, t);
  }
  if (latest == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (window_.empty()) window_.resize(size_t{kWindow} * world_);
  Sample* row = &window_[size_t{next_row_} * world_];
  for (uint32_t rank = 0; rank < world_; ++rank) {
    // A rank that never delivered (a bounded round sealed without it) was the last; otherwise the
    // latest are, unless every rank delivered at once.
    const uint32_t t = delivered_us[rank];
    row[rank] = t == 0 ? Sample{latest - first, 0, true}
                       : Sample{t - first, latest - t, !missing && t == latest && latest > first};
  }
  next_row_ = (next_row_ + 1) % kWindow;
  rows_ = std::min(rows_ + 1, kWindow);
  changed_ = true;
}

void StragglerBoard::NoteNacked(uint32_t rank, uint64_t chunks) {
  std::lock_guard<std::mutex> lock(mu_);
  if (rank < world_) nacked_[rank] += chunks;
  changed_ = true;
}

void StragglerBoard::NoteRepaired(uint32_t rank) {
  std::lock_guard<std::mutex> lock(mu_);
  if (rank < world_) ++repaired_[rank];
  changed_ = true;
}

RankLateness StragglerBoard::Summarize(uint32_t rank, std::vector<uint32_t>* scratch) const {
  RankLateness out{.rank = rank, .rounds = rows_, .nacked = nacked_[rank], .repaired = repaired_[rank]};
  scratch->clear();
  uint64_t sum = 0, ahead = 0;
  for (uint32_t row = 0; row < rows_; ++row) {
    const Sample& s = window_[size_t{row} * world_ + rank];
    scratch->push_back(s.late_us);
    sum += s.late_us;
    ahead += s.ahead_us;
    out.last += s.last;
  }
  if (scratch->empty()) return out;
  out.mean_us = static_cast<uint32_t>(sum / scratch->size());
  out.ahead_us = static_cast<uint32_t>(ahead / scratch->size());
  auto at = [&](double q) {
    auto nth = scratch->begin() + static_cast<ptrdiff_t>(q * static_cast<double>(scratch->size() - 1) + 0.5);
    std::nth_element(scratch->begin(), nth, scratch->end());
    return *nth;
  };
  out.p50_us = at(0.5);
  out.p99_us = at(0.99);
  return out;
}

void StragglerBoard::NoteStage(uint32_t leader, std::vector<RankLateness> members, int64_t now_ns) {
  std::erase_if(members, [this](const RankLateness& m) { return m.rank >= world_; });
  std::lock_guard<std::mutex> lock(mu_);
  stages_[leader] = StageReport{std::move(members), now_ns};
  changed_ = true;
}

void StragglerBoard::MergeStages(int64_t now_ns) {
  std::erase_if(stages_, [now_ns](const auto& s) { return now_ns - s.second.at_ns > kStageReportNs; });
  if (stages_.empty()) return;
  if (summary_.empty()) {  // no round here: the stages' own views, the newest for a rank in two
    std::map<uint32_t, std::pair<int64_t, RankLateness>> newest;
    for (const auto& [leader, report] : stages_) {
      for (const RankLateness& m : report.members) {
        auto [it, added] = newest.try_emplace(m.rank, report.at_ns, m);
        if (!added && it->second.first < report.at_ns) it->second = {report.at_ns, m};
      }
    }
    for (const auto& [rank, m] : newest) summary_.push_back(m.second);
    return;
  }
  auto less = [](uint32_t a, uint32_t b) { return a > b ? a - b : 0; };
  for (const auto& [leader, report] : stages_) {  // summary_ holds a rank each, in rank order
    for (const RankLateness& m : report.members) {
      RankLateness& r = summary_[m.rank];
      r.mean_us = less(r.mean_us, m.ahead_us);
      r.p50_us = less(r.p50_us, m.ahead_us);
      r.p99_us = less(r.p99_us, m.ahead_us);
      r.last = std::min(r.last, m.last);  // last of the job only where its stage's push was, and it in its stage
    }
  }
}

void StragglerBoard::Resummarize(int64_t now_ns) {
  constexpr int64_t kResummarizeNs = 1'000'000'000;
  if (summarized_ns_ != 0 && now_ns - summarized_ns_ < kResummarizeNs) return;
  if (!changed_ && stages_.empty()) return;  // stage reports go stale with time
  changed_ = false;
  summarized_ns_ = now_ns;
  summary_.clear();
  std::vector<uint32_t> scratch;
  for (uint32_t rank = 0; rows_ > 0 && rank < world_; ++rank) summary_.push_back(Summarize(rank, &scratch));
  MergeStages(now_ns);
  std::stable_sort(summary_.begin(), summary_.end(), [](const RankLateness& a, const RankLateness& b) {
    return std::tie(a.mean_us, a.last) > std::tie(b.mean_us, b.last);
  });
}

std::vector<RankLateness> StragglerBoard::Ranks(int64_t now_ns, size_t at_most) {
  std::lock_guard<std::mutex> lock(mu_);
  Resummarize(now_ns);
  return {summary_.begin(), summary_.begin() + static_cast<ptrdiff_t>(std::min(at_most, summary_.size()))};
}

}  // namespace dlcp
