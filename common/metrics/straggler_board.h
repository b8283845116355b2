// How late each rank of a job delivers its part of a round, next to the first rank to deliver it,
// over a sliding window of rounds: the straggler view of dlcpctl top, of the slowest-rank metrics
// and of the slowest rank a heartbeat answer names (docs/operations.md).
//
// An aggregator keeps one per job: a rank delivers its part of a round (as one data thread sees
// it) when its last contribution to it arrives; a bounded round that sealed without a rank counts
// it as last. A host stage's first worker keeps one over its stage's members, who deliver their
// parts into shared memory (docs/host-stage.md), and sends its summary with its heartbeats: the
// aggregators see the stage's push for all of its ranks at once, and merge the stage's view in
// (NoteStage), so that a slow rank is named whether it shares a stage or not.
//
// Data threads note each round they deliver; control threads read. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

namespace dlcp {

struct RankLateness {
  uint32_t rank = 0;
  uint32_t rounds = 0;     // rounds in the window
  uint32_t mean_us = 0;    // lateness behind the round's first rank: what it holds a round up by
  uint32_t p50_us = 0;
  uint32_t p99_us = 0;
  uint32_t last = 0;       // rounds of the window in which it delivered last, behind the others
  uint64_t nacked = 0;     // chunks this aggregator asked it to push again: its drops, since the job began
  uint64_t repaired = 0;   // contributions of it that arrived in a repair, since the job began
  // How far ahead of the round's last rank it delivered, on average. A host stage reports it for
  // each member: its stage's push left with the last one's part, so a member is that much less late
  // than the push.
  uint32_t ahead_us = 0;
};

class StragglerBoard {
 public:
  static constexpr uint32_t kWindow = 128;  // rounds; a few steps of a job with many tensors
  // A stage's report counts while its heartbeats bring it again; a stage gone stale is dropped.
  static constexpr int64_t kStageReportNs = 10'000'000'000;

  explicit StragglerBoard(uint32_t world) : world_(world), nacked_(world), repaired_(world) {}

  // One delivered round: each rank's delivery, in microseconds after the round opened; 0 for a
  // rank that never delivered.
  void NoteRound(const std::vector<uint32_t>& delivered_us);
  void NoteNacked(uint32_t rank, uint64_t chunks);
  void NoteRepaired(uint32_t rank);
  // The view of the host stage that rank `leader` pushes for: each member's lateness behind the
  // stage's first, in ranks of this job (other ranks are ignored). It replaces that stage's last.
  // A member's lateness is then its stage's push's, less how far it was ahead of the stage's last
  // member; with no round seen here (a stage that holds the whole job), the stage's own.
  void NoteStage(uint32_t leader, std::vector<RankLateness> members, int64_t now_ns);

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
    uint32_t ahead_us = 0;  // behind the round's last
    bool last = false;
  };
  struct StageReport {
    std::vector<RankLateness> members;
    int64_t at_ns = 0;
  };
  RankLateness Summarize(uint32_t rank, std::vector<uint32_t>* scratch) const;  // with mu_ held
  // Merges the fresh stage reports into `summary_`; mu_ held.
  void MergeStages(int64_t now_ns);
  void Resummarize(int64_t now_ns);  // summary_ anew, if it changed and a second has passed; mu_ held

  mutable std::mutex mu_;
  const uint32_t world_;
  std::vector<Sample> window_;  // kWindow rows of world_ samples, a ring; allocated at the first round
  uint32_t next_row_ = 0;
  uint32_t rows_ = 0;           // rows filled, at most kWindow
  std::vector<uint64_t> nacked_;
  std::vector<uint64_t> repaired_;
  std::map<uint32_t, StageReport> stages_;  // by the rank that pushes for the stage
  std::vector<RankLateness> summary_;
  int64_t summarized_ns_ = 0;
  bool changed_ = false;  // since summary_
};

}  // namespace dlcp
