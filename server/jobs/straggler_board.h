// How late each rank of a job delivers its part of a round at this aggregator, next to the first
// rank to deliver it, over a sliding window of rounds: the straggler view of dlcpctl top, of the
// slowest-rank metrics and of the slowest rank a heartbeat answer names (docs/operations.md).
// A rank delivers its part of a round (as one data thread sees it) when its last contribution to
// it arrives; a bounded round that sealed without a rank counts it as last. Data threads note
// each round they deliver; control threads read. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace dlcp::server {

struct RankLateness {
  uint32_t rank = 0;
  uint32_t rounds = 0;     // rounds in the window
  uint32_t mean_us = 0;    // lateness behind the round's first rank: what it holds a round up by
  uint32_t p50_us = 0;
  uint32_t p99_us = 0;
  uint32_t last = 0;       // rounds of the window in which it delivered last, behind the others
  uint64_t nacked = 0;     // chunks this aggregator asked it to push again: its drops, since the job began
  uint64_t repaired = 0;   // contributions of it that arrived in a repair, since the job began
};

class StragglerBoard {
 public:
  static constexpr uint32_t kWindow = 128;  // rounds; a few steps of a job with many tensors

  explicit StragglerBoard(uint32_t world) : world_(world), nacked_(world), repaired_(world) {}

  // One delivered round: each rank's delivery, in microseconds after the round opened; 0 for a
  // rank that never delivered.
  void NoteRound(const std::vector<uint32_t>& delivered_us);
  void NoteNacked(uint32_t rank, uint64_t chunks);
  void NoteRepaired(uint32_t rank);

  // Every rank, the latest first (by mean lateness, then times last); empty before any round.
  // The mean ranks them because a job's rounds differ: a rank slowed in its computation is late
  // to each step's big rounds but not to small ones its peers wait in anyway (a barrier), which
  // can be most rounds, and so hide it from the median.
  // Summed up at most once a second (`now_ns`, monotonic): every heartbeat of a large job asks,
  // and takes only the first (`at_most` = 1), so the rest is not copied for it.
  std::vector<RankLateness> Ranks(int64_t now_ns, size_t at_most = SIZE_MAX);

 private:
  struct Sample {
    uint32_t late_us = 0;
    bool last = false;
  };
  RankLateness Summarize(uint32_t rank, std::vector<uint32_t>* scratch) const;  // with mu_ held
  void Resummarize(int64_t now_ns);  // summary_ anew, if it changed and a second has passed; mu_ held

  mutable std::mutex mu_;
  const uint32_t world_;
  std::vector<Sample> window_;  // kWindow rows of world_ samples, a ring; allocated at the first round
  uint32_t next_row_ = 0;
  uint32_t rows_ = 0;           // rows filled, at most kWindow
  std::vector<uint64_t> nacked_;
  std::vector<uint64_t> repaired_;
  std::vector<RankLateness> summary_;
  int64_t summarized_ns_ = 0;
  bool changed_ = false;  // since summary_
};

}  // namespace dlcp::server
