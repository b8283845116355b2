// A worker's host stage over the job's life (docs/host-stage.md, "Failures"). A stage that loses a
// worker can carry no op any more: ops take the network path, and this worker asks dlcpd on
// standby for the stage's next form. dlcpd forms it once the lost rank, restarted, comes back to
// the host; that rank joins the job only then, and the job goes on (RejoinJob) only once every
// rank is back, so by then dlcpd's answer is in this worker's socket. Ops go through the new stage
// from that point, which is the same point in every worker's sequence of ops: the first op after
// the job goes on, as on the network path, where rounds count from 0 again.
//
// Threading: Current, FailJob and RejoinJob from any thread; a stage's loss on its own thread;
// Stop from one thread, after which only Current is called (it then gives null).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "client/host/host_stage.h"
#include "client/host/stage_join.h"

namespace dlcp {

class StageKeeper {
 public:
  using Broken = std::function<void(const absl::Status&)>;
  // Makes the HostStage of a membership, with `broken` as its own (HostStage's constructor).
  using MakeStage = std::function<std::unique_ptr<HostStage>(StageMembership, Broken broken)>;

  // `join`: how this worker asked for `first` (its standby requests say the same). `lost` runs
  // once per stage lost, on that stage's thread, with why it was lost.
  StageKeeper(StageMembership first, StageJoinOptions join, MakeStage make, Broken lost);
  ~StageKeeper() { Stop(absl::CancelledError("dlcp client closed")); }
  StageKeeper(const StageKeeper&) = delete;
  StageKeeper& operator=(const StageKeeper&) = delete;

  // The stage to submit into; null while there is none (the network path).
  std::shared_ptr<HostStage> Current() const;
  // The job failed: the current stage's ops fail with `why` until RejoinJob.
  void FailJob(const absl::Status& why);
  // Every rank is back and the job goes on: the current stage goes on, or a lost one is replaced by
  // the stage dlcpd formed again, where it did: then true, and ops that went to the network path
  // meanwhile must be run again, through it (TransferEngine::Rejoin). Never waits for dlcpd.
  bool RejoinJob();
  // Stops every stage it holds (HostStage::Stop) and withdraws a standby request. Idempotent.
  void Stop(const absl::Status& why);

 private:
  void Make(StageMembership m);  // under mu_: the current stage from now on
  void Lose(uint64_t generation, const absl::Status& why);
  // Stops a stage another took the place of, and lets it go once no network leg of it is in flight.
  void Retire(std::shared_ptr<HostStage> stage);
  // Under mu_: the standby request's answer, if dlcpd gave one; the current stage where it was one.
  bool TakeAnswer();

  StageJoinOptions join_;
  MakeStage make_;
  Broken lost_hook_;
  const std::vector<uint32_t> ranks_;  // the first stage's: the host group the job knows
  mutable std::mutex mu_;
  std::shared_ptr<HostStage> current_;  // under mu_; null while lost
  std::shared_ptr<HostStage> lost_;     // under mu_: stopped once another takes its place
  OwnedFd standby_;                     // under mu_: a standby request not yet answered
  std::vector<std::shared_ptr<HostStage>> in_flight_;  // under mu_: retired with a leg in flight
  uint64_t generation_ = 0;             // under mu_: of current_ (or the one lost last)
  bool stopped_ = false;                // under mu_
};

}  // namespace dlcp
