// Graceful shutdown of dlcpd. Once Begin() is called, the control service refuses joins and
// answers each heartbeat with `draining`, so every worker learns within one heartbeat interval
// that this aggregator is going away: with on_aggregator_loss=remap it moves the aggregator's
// share to the others at once, and otherwise its job fails naming the reason, instead of a
// heartbeat deadline after the process has gone. The main thread polls until every member has
// let go of this aggregator (Holding() is empty: each has moved off, left or been removed), or
// every member has been told and none has asked again for a heartbeat interval (last_told), or
// its drain deadline passes, and only then stops serving.
//
// Thread-safe: Begin, Untold and Holding run on dlcpd's main thread, Told and LetGo on gRPC
// callback threads; none blocks for longer than a short lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"
#include "server/jobs/job_registry.h"

namespace dlcp::server {

class DrainTracker {
 public:
  void Begin() { active_.store(true, std::memory_order_release); }
  bool active() const { return active_.load(std::memory_order_acquire); }
  // Rank `rank` of job `job_id` got a heartbeat answer that says `draining`.
  void Told(uint32_t job_id, uint32_t rank);
  // When a heartbeat was last answered `draining`. A worker that acted on it sends no more
  // heartbeats here; one that had to put it off (it was in the middle of a regroup, which may
  // still need this aggregator) asks again a heartbeat interval later, and is told again.
  absl::Time last_told() const { return absl::FromUnixNanos(last_told_ns_.load(std::memory_order_acquire)); }
  // Rank `rank` of job `job_id`, still a member here, asked to join again while draining. A worker
  // joins an aggregator it counts as a member of only to probe one it has given up as lost, so it
  // has moved its share off this one and needs nothing more from it. Without this, the drain
  // would learn so only from its silence, a heartbeat interval later.
  void LetGo(uint32_t job_id, uint32_t rank);
  // "job 'J' rank R", sorted, for every member still joined in `jobs` and not told yet. A member
  // that left, or was removed at the heartbeat deadline, needs telling no more. Empty before Begin.
  std::vector<std::string> Untold(const JobRegistry& jobs) const;
  // The same, for every member that has not let go: one may still need this aggregator, if only
  // to finish a regroup. Empty before Begin.
  std::vector<std::string> Holding(const JobRegistry& jobs) const;

 private:
  static uint64_t Id(uint32_t job_id, uint32_t rank) { return (uint64_t{job_id} << 32) | rank; }
  // Members still joined in `jobs` and not in `done`, as Untold names them.
  std::vector<std::string> Joined(const JobRegistry& jobs, const absl::flat_hash_set<uint64_t>& done) const;

  std::atomic<bool> active_{false};
  std::atomic<int64_t> last_told_ns_{0};
  mutable std::mutex mu_;
  absl::flat_hash_set<uint64_t> told_;
  absl::flat_hash_set<uint64_t> let_go_;
};

}  // namespace dlcp::server
