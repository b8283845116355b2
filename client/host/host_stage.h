// A worker's host stage (docs/host-stage.md): the workers of a job on one host sum their tensors
// in shared memory, and only the stage's first worker sends the host's sum to the aggregators
// and receives the job's; every worker then reads the result from the shared memory. A host with
// L workers sends each tensor once instead of L times, and none of its bytes crosses a socket on
// the way between its workers.
//
// Threading: Submit from any thread; ops run in the order they were submitted, which must be the
// same on every worker of the stage (as the order of collective ops is). The stage has two threads
// of its own: one begins each op's steps, the other ends them in the same order (StageSteps), so
// up to kStageBanks steps, of as many ops, are under way at once and their network legs overlap
// as ops do on the network path. OpDone runs on the ending thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/client.h"
#include "client/host/spare_buffers.h"
#include "client/host/stage_classes.h"
#include "client/host/stage_steps.h"
#include "client/leg_gate.h"
#include "client/timeline.h"
#include "common/metrics/straggler_board.h"

namespace dlcp {

class HostStage {
 public:
  // The first worker's way to the aggregators: submits `sum`, the host's sum of a whole tensor of
  // `key`, as an op whose pushes carry the whole stage (TransferEngine::Submit with the stage's
  // size). Null for a stage that holds every rank of the job: its sum is the result. With `gate`,
  // `sum` is still being summed: its parts go out as the gate opens (TransferEngine's StageLeg).
  using NetworkSubmit = std::function<void(uint32_t key, absl::Span<float> sum, const AllReduceOptions& options,
                                           int64_t root, std::shared_ptr<LegGate> gate, OpDone)>;

  // Rounds of a key that the first worker's network legs ran for this one (TransferEngine::
  // SkipRounds): every worker's engine then numbers the key's rounds alike, should a later op of
  // it take the network path. Called on the other workers of a stage that has network legs.
  using RoundsElsewhere = std::function<void(uint32_t key, uint32_t rounds)>;

  struct Limits {
    uint32_t world = 1;  // the job's size, which every result of a reliable op sums
    absl::Duration op_timeout;
    // A bounded-loss op's steps, in elements, at most a slot: each step's chunks' classes travel in
    // the region's header (kStageMaxClasses of them).
    uint64_t bounded_step_elems = 0;
    // How a stage that holds the whole job classes a bounded op's chunks (StageClasses).
    ClassPolicyOptions class_policy;
    uint32_t chunk_elems = 0;
    uint32_t num_layers = 0;
    // Where the stage's ops and their steps go (ClientOptions::timeline); null: nowhere.
    std::shared_ptr<Timeline> timeline;
  };

  // `broken`: runs once, on one of the stage's threads, when a worker of the stage is found gone:
  // no op can go through the stage any more.
  HostStage(StageMembership membership, NetworkSubmit network, RoundsElsewhere elsewhere, Limits limits,
            std::function<void(const absl::Status&)> broken);
  ~HostStage();
  HostStage(const HostStage&) = delete;
  HostStage& operator=(const HostStage&) = delete;

  const std::vector<uint32_t>& ranks() const { return steps_.ranks(); }
  uint32_t member() const { return steps_.member(); }  // this worker's place in ranks()
  uint64_t slot_elems() const { return steps_.slot_elems(); }
  // Sums `data` over the job, in place (root >= 0: replaces it with rank root's). `data` stays
  // the caller's until `done`. options.loss_bound is the op's ε, resolved (not negative).
  void Submit(uint32_t key, absl::Span<float> data, const AllReduceOptions& options, int64_t root, OpDone done);
  // Sums a tensor in CUDA device memory over the job, in place. Each step copies its part from
  // the device straight into this worker's slot, and the result from the step's sum slot straight
  // back: the region is pinned at the first such op. The tensor's values must be ready (the caller
  // waited for the work that produces them), and it stays the caller's until `done`.
  void SubmitDevice(uint32_t key, const DeviceTensor& tensor, const AllReduceOptions& options, OpDone done);
  // The job failed (an aggregator said so at a heartbeat): the running op and later ones fail
  // with `why` until RejoinJob, as the job's ops on the network path do. Any thread.
  void FailJob(const absl::Status& why);
  // Every rank is back and the job goes on. Any thread.
  void RejoinJob();
  // Fails the queued ops and the running ones with `why`, joins the threads, and leaves the stage:
  // the other workers' ops fail from then on, naming this rank. Idempotent.
  void Stop(const absl::Status& why);
  // A network leg of it is still an op of the engine, which writes into the stage's memory and
  // calls back into it until it ends; after Stop, once false it stays false. Any thread.
  bool LegsInFlight() const { return legs_in_flight_.load() != 0; }
  // On the stage's first worker: how late each member (by rank) comes to the stage's ops, behind
  // the first to come, over the last StragglerBoard::kWindow ops; empty elsewhere and before the
  // first op. Its heartbeats carry it to the aggregators' straggler view. Any thread.
  std::vector<RankLateness> MemberLateness() const;

 private:
  struct Op {
    uint32_t key = 0;
    absl::Span<float> data;
    std::optional<DeviceTensor> device;  // set: the tensor is there, and `data` is empty
    AllReduceOptions options;
    int64_t root = -1;
    OpDone done;
    uint64_t elems() const { return device ? device->elems : data.size(); }
  };
  // How a step takes part in its op. An op of one step, or in a stage without network legs, goes
  // in steps that each sum and return their part (kWhole). A larger op of a stage with network
  // legs first sums every step into the first worker's copy of the whole tensor (kSum), which
  // then goes to the aggregators in one round, as a worker without a stage pushes it (a host whose
  // stage splits its rounds would not match a host without one), and the result then comes back
  // step by step (kResult).
  enum class Phase { kWhole, kSum, kResult };
  // A two-phase op's one network round, on the first worker: it starts with the first sum step,
  // each part goes out as soon as it is summed (its gate), and its end ends the last sum step.
  class NetworkRound {
   public:
    explicit NetworkRound(uint64_t elems) : gate_(std::make_shared<LegGate>(elems)) {}
    const std::shared_ptr<LegGate>& gate() const { return gate_; }
    void End(const absl::Status& status);  // any thread
    // Runs `done` at End, or at once where it has ended: the last sum step, and each result step.
    void OnEnd(LegDone done);

   private:
    std::shared_ptr<LegGate> gate_;
    std::mutex mu_;  // guards what follows
    std::optional<absl::Status> ended_;
    std::vector<LegDone> waiters_;
  };
  // An op whose steps are under way, and what they said so far. Its fields are the ending thread's
  // once its first step is begun, but for its failure, which both threads note and read.
  struct Running {
    Op op;
    absl::Time start;
    absl::Time deadline;
    uint64_t trace_id = 0;  // its span on the timeline
    RoundStats stats;
    std::optional<StageLoss> heard;  // a bounded op's losses, from the first worker's round
    std::vector<uint8_t> classes;    // ... and its chunks' classes
    uint64_t steps_left = 0;  // not yet ended or skipped
    // kSum / kResult, on the first worker: the whole tensor's sum, then its result, and the
    // network round's outcome.
    SpareBuffers::Buffer whole;
    std::shared_ptr<absl::StatusOr<RoundStats>> network;
    std::shared_ptr<NetworkRound> round;
    // The first failure of a step.
    absl::Status failure() const;
    void Fail(const absl::Status& why);

   private:
    mutable std::mutex mu_;
    absl::Status status_;  // under mu_
  };
  // A step begun and not yet ended. `leg` is the first worker's network leg's outcome (null where
  // the step's leg is a copy), written before the step's result is posted (and read only after),
  // and kept alive for a leg that ends late.
  struct Pending {
    std::shared_ptr<Running> run;
    Phase phase = Phase::kWhole;
    BegunStep begun;
    StepIo io;
    std::shared_ptr<absl::StatusOr<RoundStats>> leg;
    StepSpec spec;
  };
  void Enqueue(Op op);
  void Run();       // the beginning thread
  void EndSteps();  // the ending thread
  // The next op, once there is one; none when stopping.
  std::optional<Op> Take();
  // Hands a step begun to the ending thread.
  void Hand(Pending p);
  // Begins the op's steps, each handed to the ending thread.
  void StartOp(Op op);
  // Begins (or gives up, once the op failed) the op's steps of one phase.
  void StartPhase(const std::shared_ptr<Running>& run, Phase phase);
  Pending BeginStep(const std::shared_ptr<Running>& run, const StepSpec& spec, Phase phase);
  // The first worker's leg of a step of `phase`: the network round, or a copy to or from `whole`.
  NetworkLeg LegOf(const std::shared_ptr<Running>& run, Phase phase, const std::shared_ptr<absl::StatusOr<RoundStats>>& out);
  // kResult, on the first worker: the network round's losses and classes of the step's chunks, for
  // the others to report.
  void PostResultLoss(const Running& run, const StepSpec& spec, uint64_t step);
  void EndStep(Pending p);
  void StepFailed(Running& run, const absl::Status& status);  // either thread
  void StepGone(Running& run);  // a step of it ended or was skipped: done when it was the last
  void Complete(Running& run);  // runs its OpDone
  // The first worker: how late each member came to an op's first step.
  void NoteCame(const BegunStep& begun);
  // The op's span on the timeline, and a moment of it.
  void TraceBegin(const Running& run) const;
  void Trace(const Running& run, const char* what, absl::Time t, std::string args = "") const;
  void TraceEnd(const Running& run, const absl::Status& status) const;
  // A bounded op of a stage that holds the whole job: its classes and losses, from its result.
  absl::Status ClassWholeJob(Running& run);
  // How step `spec` of `op` reads its part and writes its result.
  StepIo IoOf(const Op& op, const StepSpec& spec, Phase phase) const;
  StepIo IoOf(const Op& op, const StepSpec& spec) const;  // both ways
  // Pins the region for copies from and to `device`, once; where that fails, copies go through
  // the CUDA runtime's staging, slower but the same.
  void PinForDevice(int device);
  // The first worker's network leg of step `step` of `op`; writes its outcome into `out`, and a
  // bounded round's losses into the step's result for the others where `post_loss`.
  void StartLeg(float* sum, const StepSpec& spec, uint64_t step, const Running& run, bool post_loss,
                std::shared_ptr<absl::StatusOr<RoundStats>> out, LegDone done, std::shared_ptr<LegGate> gate = nullptr);
  // kSum, on the first worker: step `s`'s part into `whole`; the first step starts the round, and
  // the last one ends with it. kResult: step `s`'s part of the round's result, once it has ended.
  void ResultLeg(const std::shared_ptr<Running>& run, float* bank, const StepSpec& s, uint64_t step, LegDone done);
  void SumLeg(const std::shared_ptr<Running>& run, float* bank, const StepSpec& s, uint64_t step, bool last,
              LegDone done);
  absl::Status Interrupted() const;  // stopping, or the job failed
  absl::Status Stopped() const;
  // Elements per step of `op`, and how many steps it takes (per phase).
  uint64_t StepElemsOf(const Op& op) const;
  uint64_t StepsOf(const Op& op) const { return (op.elems() + StepElemsOf(op) - 1) / StepElemsOf(op); }
  // The stage has network legs (it does not hold the whole job).
  bool Networked() const { return ranks().size() < limits_.world; }
  // `op` goes in two phases (kSum, kResult) around one network round.
  bool InTwoPhases(const Op& op) const { return Networked() && StepsOf(op) > 1; }
  // This worker's stage has network legs, and its first worker, not this one, runs them.
  bool LegElsewhere() const { return !steps_.first() && Networked(); }

  StageSteps steps_;
  NetworkSubmit network_;
  RoundsElsewhere elsewhere_;
  Limits limits_;
  std::function<void(const absl::Status&)> broken_;  // under mu_; null once it ran
  std::map<uint32_t, uint32_t> rounds_;  // the beginning thread's: ops run per key
  // `whole` of the ops under way: as many as there are banks at most.
  SpareBuffers spares_{kStageBanks};
  StageClasses classes_;  // the ending thread's
  std::unique_ptr<StragglerBoard> lateness_;  // on the first worker: by member
  bool pin_tried_ = false;  // the beginning thread's
  bool pinned_ = false;     // the beginning thread's until it is joined
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Op> queue_;
  std::mutex begun_mu_;  // guards the two below
  std::condition_variable begun_cv_;
  std::deque<Pending> begun_;  // steps begun, for the ending thread, oldest first
  bool begun_all_ = false;     // the beginning thread has ended
  absl::Status stopped_;  // under mu_; not OK once Stop was called
  absl::Status job_failure_;  // under mu_; not OK while the job has failed
  std::atomic<bool> stopping_{false};
  std::atomic<bool> job_failed_{false};
  std::atomic<uint32_t> legs_in_flight_{0};
  std::thread thread_;  // begins steps
  std::thread ender_;   // ends them
};

}  // namespace dlcp
