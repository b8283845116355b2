// One round of one tensor of one job, as seen by one data thread: the accumulator for the chunks
// this thread owns, who has contributed each chunk, and which workers have confirmed the result.
// Owned and touched by a single data thread; no locking.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "common/wire/geometry.h"
#include "common/wire/payload_encoding.h"
#include "server/jobs/job_registry.h"
#include "server/rounds/loss_tracker.h"
#include "server/rounds/block_pool.h"
#include "server/rounds/result_ledger.h"

namespace dlcp::server {

class Round {
 public:
  // kNoMemory: the job's budget (or the allocator) is out; kNoAggregatorMemory: the aggregator's,
  // over all jobs (MemoryBudget).
  enum class AddResult { kAdded, kCompleted, kDuplicate, kNoMemory, kNoAggregatorMemory, kSealed };

  // `epoch`: the job's epoch the round's packets carry; 0 means the job's current one.
  Round(std::shared_ptr<Job> job, uint32_t key, uint32_t round, wire::ChunkGeometry geometry, BlockPool* pool,
        absl::Time now, uint32_t epoch = 0);
  ~Round();
  Round(const Round&) = delete;
  Round& operator=(const Round&) = delete;

  // Adds rank's contribution to `chunk` (payload holds geometry().elems(chunk) floats). The first
  // contribution is copied, later ones summed; a repeat from the same rank is never summed twice,
  // and nothing is summed once the round is sealed (its results may already be out).
  // `host_group`: the push carries the sum of every rank of rank's host group (Job::HostGroup,
  // rank first), which then count as contributors and get their results through rank.
  AddResult Add(uint32_t rank, uint32_t chunk, const float* payload, absl::Time now,
                std::shared_ptr<const std::vector<uint32_t>> host_group = nullptr);
  // Its contributions come in another rank's pushes (its host group's first rank): that rank gets
  // its results, asks for repairs and says DONE for it.
  bool Carried(uint32_t rank) const { return !carried_.empty() && carried_[rank]; }
  // The host group `rank` pushed for in this round, itself first; null before its first such push.
  // The data path asks here first, so a round takes the job's lock once per group, not per push.
  std::shared_ptr<const std::vector<uint32_t>> HostGroupLedBy(uint32_t rank) const;
  // From now on, `group`'s ranks after its first are carried by the first (a host stage's
  // manifest or first push). Idempotent.
  void CarryGroup(std::shared_ptr<const std::vector<uint32_t>> group);
  // The rank whose pushes carry `rank`'s contributions in this round: its host group's first, or
  // itself.
  uint32_t CarrierOf(uint32_t rank) const;

  bool Has(uint32_t rank, uint32_t chunk) const;
  bool IsComplete(uint32_t chunk) const { return contributors_[chunk] == job_->world; }
  // Its result will not change: every worker contributed, or the bounded round sealed with it.
  bool HasFinalResult(uint32_t chunk) const {
    return IsComplete(chunk) || (sealed_ && bounded != nullptr && bounded->owned(chunk));
  }
  uint16_t contributors(uint32_t chunk) const { return contributors_[chunk]; }
  // What the round has sent of its results: their classes, paths and copies (ResultLedger).
  ResultLedger& results() { return results_; }
  const ResultLedger& results() const { return results_; }

  // How the round's values travel, set by its first push; a push in another encoding does not
  // belong to it (false).
  bool AcceptEncoding(wire::Encoding e) {
    if (!encoding_set_) {
      encoding_ = e;
      encoding_set_ = true;
    }
    return encoding_ == e;
  }
  wire::Encoding encoding() const { return encoding_; }

  // The sum so far; nullptr while nobody has contributed to the chunk.
  const float* Result(uint32_t chunk) const;

  // Bounded loss: set by the first manifest. A sealed round takes no more contributions; every
  // owned chunk has its final result, with whatever contributors it had.
  std::unique_ptr<LossTracker> bounded;
  // Makes the round bounded (idempotent); pushes may overtake the manifest, so the tracker
  // learns of every contribution already summed.
  LossTracker& EnableBounded();
  bool sealed() const { return sealed_; }
  void Seal() { sealed_ = true; }
  // A bounded round's tail, kept by BoundedRounds.
  struct Tail {
    bool armed = false;   // the bound is met; waiting out the tail
    absl::Time armed_at;  // when it was met
    // From the bound being met to the seal: what the round waited for stragglers it could do
    // without. Zero when everything came in as the bound was met. Set by the seal.
    absl::Duration wait;
  };
  Tail tail;
  // Delivered: every chunk complete (reliable), or sealed (bounded).
  bool Finished() const { return sealed_ || (open_chunks_ == 0 && bounded == nullptr); }

  // Chunks that some but not all workers have sent, and that `rank` has not.
  std::vector<uint32_t> MissingFrom(uint32_t rank) const;
  uint32_t open_chunks() const { return open_chunks_; }

  // Returns true if `rank` was not done before. Marks the ranks it carries done with it.
  bool MarkDone(uint32_t rank);
  bool IsDone(uint32_t rank) const { return done_[rank]; }
  bool AllDone() const { return done_count_ == job_->world; }

  const std::shared_ptr<Job>& job() const { return job_; }
  uint32_t key() const { return key_; }
  uint32_t round() const { return round_; }
  uint32_t epoch() const { return epoch_; }
  // The job has regrouped since this round began: nothing of it can complete any more.
  bool Superseded() const { return epoch_ != job_->epoch.load(std::memory_order_relaxed); }
  const wire::ChunkGeometry& geometry() const { return geometry_; }
  absl::Time created() const { return created_; }
  absl::Time last_progress() const { return last_progress_; }
  uint64_t contributions() const { return contributions_; }
  // When the first push arrived (created() until one has): a round may begin at a request.
  absl::Time first_contribution() const { return first_contribution_; }

  // Per rank, when its latest contribution arrived, in microseconds after created() (0: none):
  // once the round is delivered, when each rank delivered its part (StragglerBoard).
  const std::vector<uint32_t>& delivered_us() const { return delivered_us_; }

  // Repair pacing, owned by the data thread's timer scan.
  struct Repair {
    absl::Time next;        // the next NACK or probe, at the earliest
    int attempts = 0;       // in a row without progress: each backs the next off further
    absl::Time last_plan;   // when a worker's result request last drew a repair plan
  };
  Repair repair;

 private:
  float* ChunkPtr(uint32_t chunk) const;

  std::shared_ptr<Job> job_;
  uint32_t key_;
  uint32_t round_;
  uint32_t epoch_;
  wire::ChunkGeometry geometry_;
  BlockPool* pool_;
  size_t block_bytes_;
  uint32_t words_;  // bitmap words per chunk
  std::vector<float*> blocks_;
  std::vector<uint64_t> got_;  // chunk_count x words_ bits: who contributed
  std::vector<uint16_t> contributors_;
  uint32_t MicrosSinceCreated(absl::Time now) const {
    return static_cast<uint32_t>(std::clamp<int64_t>(absl::ToInt64Microseconds(now - created_) + 1, 1, UINT32_MAX));
  }
  ResultLedger results_;
  uint32_t open_chunks_ = 0;   // touched but not complete
  wire::Encoding encoding_ = wire::Encoding::kF32;
  bool encoding_set_ = false;
  bool sealed_ = false;
  uint64_t contributions_ = 0;
  std::vector<bool> done_;
  std::vector<uint32_t> delivered_us_;  // per rank: its latest contribution, as MicrosSinceCreated
  uint32_t done_count_ = 0;
  // Host groups whose first rank pushed here, and who is carried by one (allocated on use).
  std::vector<std::shared_ptr<const std::vector<uint32_t>>> host_groups_;
  std::vector<bool> carried_;
  // The bits and counts of a push carrying `group`; returns how many ranks it added.
  uint32_t MarkCarried(const std::vector<uint32_t>& group, uint32_t chunk, absl::Time now);
  absl::Time created_;
  absl::Time last_progress_;
  absl::Time first_contribution_;
};

}  // namespace dlcp::server
