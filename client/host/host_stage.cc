#include "client/host/host_stage.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/packer/packer.h"
#include "common/base/clock.h"
#include "common/base/json_text.h"
#include "common/base/log.h"
#include "common/wire/bounded.h"

namespace dlcp {
namespace {

// The round's losses between RoundStats and the region's StageLoss, which name them alike: the
// first member posts its network leg's, and the others report them as theirs.
template <typename From, typename To>
void CopyLoss(const From& from, To* to) {
  for (size_t c = 0; c < 4; ++c) {
    to->chunks_by_class[c] = from.chunks_by_class[c];
    to->left_out_by_class[c] = from.left_out_by_class[c];
  }
  to->droppable_total = from.droppable_total;
  to->droppable_missing = from.droppable_missing;
  to->pull_missing = from.pull_missing;
  to->bound_violations = from.bound_violations;
  to->min_contributors = from.min_contributors;
}

// The first worker's op: what its one network round did, under the op's own key, round and time,
// and with the round's ε where phase_aware raised the op's.
void TakeLegStats(const RoundStats& leg, RoundStats* op) {
  RoundStats taken = leg;
  taken.key = op->key;
  taken.round = op->round;
  taken.time = op->time;
  taken.loss_bound = std::max(op->loss_bound, leg.loss_bound);
  *op = std::move(taken);
}

// A step's part of its op, for the timeline.
std::string StepArgs(const StepSpec& s) { return absl::StrCat("\"offset\":", s.offset, ",\"elems\":", s.elems); }

// A stage op's span: apart from the engine's spans (key << 32 | round), which the first worker's
// network legs have, by the round's top bit (no key runs 2^31 rounds).
uint64_t StageTraceId(uint32_t key, uint32_t round) { return uint64_t{key} << 32 | round | uint32_t{1} << 31; }
// ... and its name, as the engine names its own (AllReduceOptions::name, else "key K").
std::string SpanName(uint32_t key, const AllReduceOptions& options) {
  return options.name.empty() ? absl::StrCat("key ", key) : options.name;
}

}  // namespace

HostStage::HostStage(StageMembership membership, NetworkSubmit network, RoundsElsewhere elsewhere, Limits limits,
                     std::function<void(const absl::Status&)> broken)
    : steps_(std::move(membership)),
      network_(std::move(network)),
      elsewhere_(std::move(elsewhere)),
      limits_(limits),
      broken_(std::move(broken)),
      classes_({limits.class_policy, limits.chunk_elems, limits.num_layers, limits.world}) {
  if (steps_.first()) lateness_ = std::make_unique<StragglerBoard>(static_cast<uint32_t>(ranks().size()));
  ender_ = std::thread([this] { EndSteps(); });
  thread_ = std::thread([this] { Run(); });
}

HostStage::~HostStage() {
  Stop(absl::CancelledError("dlcp client closed"));
  if (pinned_) UnpinHostMemory(steps_.region()).IgnoreError();  // the region is unmapped next
}

void HostStage::Submit(uint32_t key, absl::Span<float> data, const AllReduceOptions& options, int64_t root,
                       OpDone done) {
  Enqueue(Op{key, data, std::nullopt, options, root, std::move(done)});
}

void HostStage::SubmitDevice(uint32_t key, const DeviceTensor& tensor, const AllReduceOptions& options, OpDone done) {
  Enqueue(Op{key, {}, tensor, options, -1, std::move(done)});
}

void HostStage::Enqueue(Op op) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!stopped_.ok()) {
    const absl::Status why = stopped_;
    lock.unlock();
    return op.done(why);
  }
  queue_.push_back(std::move(op));
  cv_.notify_one();
}

void HostStage::Stop(const absl::Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_.ok()) stopped_ = why;
    stopping_.store(true);
    cv_.notify_all();
  }
  steps_.Wake();  // its waits look at Interrupted() again
  if (thread_.joinable()) thread_.join();
  if (ender_.joinable()) ender_.join();
  steps_.Leave();  // a closed client is gone for the others, though its process may live on
}

void HostStage::FailJob(const absl::Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (job_failure_.ok()) job_failure_ = why;
    job_failed_.store(true);
  }
  steps_.Wake();
}

void HostStage::RejoinJob() {
  std::lock_guard<std::mutex> lock(mu_);
  job_failure_ = absl::OkStatus();
  job_failed_.store(false);
}

absl::Status HostStage::Interrupted() const {
  if (!stopping_.load(std::memory_order_relaxed) && !job_failed_.load(std::memory_order_relaxed)) {
    return absl::OkStatus();
  }
  std::lock_guard<std::mutex> lock(mu_);
  return stopped_.ok() ? job_failure_ : stopped_;
}

absl::Status HostStage::Stopped() const {
  if (!stopping_.load(std::memory_order_relaxed)) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  return stopped_;
}

void HostStage::Run() {
  while (std::optional<Op> op = Take()) StartOp(std::move(*op));
  std::deque<Op> left;
  absl::Status why;
  {
    std::lock_guard<std::mutex> lock(mu_);
    left.swap(queue_);
    why = stopped_;
  }
  for (Op& o : left) o.done(why);
  std::lock_guard<std::mutex> lock(begun_mu_);
  begun_all_ = true;
  begun_cv_.notify_one();
}

void HostStage::EndSteps() {
  for (;;) {
    std::unique_lock<std::mutex> lock(begun_mu_);
    begun_cv_.wait(lock, [&] { return !begun_.empty() || begun_all_; });
    if (begun_.empty()) return;
    Pending p = std::move(begun_.front());
    begun_.pop_front();
    lock.unlock();
    EndStep(std::move(p));
  }
}

void HostStage::Hand(Pending p) {
  std::lock_guard<std::mutex> lock(begun_mu_);
  begun_.push_back(std::move(p));
  begun_cv_.notify_one();
}

std::optional<HostStage::Op> HostStage::Take() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !queue_.empty() || !stopped_.ok(); });
  if (!stopped_.ok()) return std::nullopt;
  Op op = std::move(queue_.front());
  queue_.pop_front();
  return op;
}

absl::Status HostStage::Running::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

void HostStage::Running::Fail(const absl::Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (status_.ok()) status_ = why;
}

void HostStage::StartOp(Op op) {
  auto run = std::make_shared<Running>();
  run->start = MonotonicNow();
  run->deadline = run->start + limits_.op_timeout;
  run->stats.key = op.key;
  run->stats.round = rounds_[op.key]++;
  run->trace_id = StageTraceId(op.key, run->stats.round);
  run->stats.min_contributors = limits_.world;  // the first worker's network legs may say otherwise
  run->stats.loss_bound = std::max(0.0, op.options.loss_bound);
  run->op = std::move(op);
  const Op& o = run->op;
  TraceBegin(*run);
  const bool two_phases = InTwoPhases(o);
  run->steps_left = StepsOf(o) * (two_phases ? 2 : 1);
  // A failed job fails the op at once, as on the network path; its steps are still gone through.
  if (absl::Status interrupted = Interrupted(); !interrupted.ok()) run->Fail(interrupted);
  if (o.elems() == 0) return Complete(*run);
  if (o.device) PinForDevice(o.device->device);
  // Not the caller's memory: the engine may write into it until its round ends, which a closing
  // client does not wait for before it fails the op. It goes back to the spares once the last
  // holder of `run` (the round's completion among them) lets go.
  if (two_phases && steps_.first()) {
    run->whole = spares_.Take(o.elems());
    if (run->whole == nullptr) {
      run->Fail(absl::ResourceExhaustedError(
          absl::StrCat("host stage: no memory for key ", o.key, "'s sum of ", o.elems() * sizeof(float), " bytes")));
    }
  }
  if (two_phases && steps_.first() && network_ != nullptr) {
    run->network = std::make_shared<absl::StatusOr<RoundStats>>();
    run->round = std::make_shared<NetworkRound>(o.elems());
  }
  if (!two_phases) return StartPhase(run, Phase::kWhole);
  StartPhase(run, Phase::kSum);
  StartPhase(run, Phase::kResult);  // its steps' legs wait for the network round to end
}

void HostStage::StartPhase(const std::shared_ptr<Running>& run, Phase phase) {
  const Op& o = run->op;
  // The op's ε as given (the round may run under another: phase_aware), for the members to agree on.
  const auto bound_ppm = static_cast<uint32_t>(std::lround(std::max(0.0, o.options.loss_bound) * wire::kPpm));
  const uint32_t kind = o.root >= 0 ? static_cast<uint32_t>(o.root) + 1 : 0;
  const uint64_t step_elems = StepElemsOf(o);
  for (uint64_t offset = 0; offset < o.elems(); offset += step_elems) {
    StepSpec spec{o.key, kind, offset, std::min<uint64_t>(step_elems, o.elems() - offset), o.elems(), bound_ppm};
    spec.result_only = phase == Phase::kResult;
    // Once the op failed, the rest of its steps are given up, so every worker stays in step.
    if (absl::Status failed = run->failure(); !failed.ok()) {
      Hand(Pending{run, phase, steps_.GiveUpStep(spec, failed, run->deadline, [this] { return Interrupted(); }), {},
                   nullptr, spec});
      continue;
    }
    Hand(BeginStep(run, spec, phase));
  }
}

HostStage::Pending HostStage::BeginStep(const std::shared_ptr<Running>& run, const StepSpec& spec, Phase phase) {
  Pending p{run, phase, {}, IoOf(run->op, spec, phase), nullptr, spec};
  NetworkLeg leg;
  if (network_) {
    if (phase == Phase::kWhole) p.leg = std::make_shared<absl::StatusOr<RoundStats>>();
    if (phase == Phase::kSum && spec.offset + spec.elems == run->op.elems()) p.leg = run->network;
    leg = LegOf(run, phase, p.leg);
  }
  p.begun = steps_.Begin(spec, p.io, leg, run->deadline, [this] { return Interrupted(); });
  if (!p.begun.status.ok()) {
    StepFailed(*run, p.begun.status);
    return p;
  }
  if (spec.offset == 0 && phase != Phase::kResult) NoteCame(p.begun);
  if (limits_.timeline && phase != Phase::kResult) {
    Trace(*run, "gathered", p.begun.gathered, StepArgs(spec));
    Trace(*run, "summed", MonotonicNow(), StepArgs(spec));
  }
  return p;
}

NetworkLeg HostStage::LegOf(const std::shared_ptr<Running>& run, Phase phase,
                            const std::shared_ptr<absl::StatusOr<RoundStats>>& out) {
  if (phase == Phase::kWhole) {
    return [this, run, out](float* sum, const StepSpec& s, uint64_t step, LegDone done) {
      StartLeg(sum, s, step, *run, /*post_loss=*/true, out, std::move(done));
    };
  }
  if (phase == Phase::kResult) {
    return [this, run](float* bank, const StepSpec& s, uint64_t step, LegDone done) {
      ResultLeg(run, bank, s, step, std::move(done));
    };
  }
  return [this, run, last = out != nullptr](float* bank, const StepSpec& s, uint64_t step, LegDone done) {
    SumLeg(run, bank, s, step, last, std::move(done));
  };
}

void HostStage::SumLeg(const std::shared_ptr<Running>& run, float* bank, const StepSpec& s, uint64_t step, bool last,
                       LegDone done) {
  std::memcpy(run->whole.get() + s.offset, bank, s.elems * sizeof(float));
  NetworkRound& round = *run->round;
  if (s.offset == 0) {
    // The whole tensor's one round, as a worker without a stage pushes it, starts with its first
    // part. It holds the op (and so `whole`, which the engine writes into) until it ends.
    StepSpec whole = s;
    whole.elems = run->op.elems();
    StartLeg(run->whole.get(), whole, step, *run, /*post_loss=*/false, run->network,
             [run](const absl::Status& status) { run->round->End(status); }, round.gate());
  }
  round.gate()->Open(s.offset + s.elems);
  if (!last) return done(absl::OkStatus());
  round.OnEnd(std::move(done));
}

void HostStage::ResultLeg(const std::shared_ptr<Running>& run, float* bank, const StepSpec& s, uint64_t step,
                          LegDone done) {
  auto copy = [this, run, bank, s, step, done = std::move(done)](const absl::Status& round) {
    // A failed round failed the op already (its last sum step): this step only ends.
    if (round.ok()) {
      std::memcpy(bank, run->whole.get() + s.offset, s.elems * sizeof(float));
      if (s.loss_bound_ppm > 0) PostResultLoss(*run, s, step);
    }
    done(round);
  };
  if (run->round == nullptr) return copy(absl::OkStatus());  // no network: `whole` holds the sum
  run->round->OnEnd(std::move(copy));
}

void HostStage::NetworkRound::End(const absl::Status& status) {
  std::vector<LegDone> waiters;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ended_ = status;
    waiters.swap(waiters_);
  }
  for (LegDone& waiter : waiters) waiter(status);
}

void HostStage::NetworkRound::OnEnd(LegDone done) {
  absl::Status status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ended_) {
      waiters_.push_back(std::move(done));
      return;
    }
    status = *ended_;
  }
  done(status);
}

void HostStage::PostResultLoss(const Running& run, const StepSpec& spec, uint64_t step) {
  if (run.network == nullptr || !run.network->ok()) return;
  const RoundStats& r = **run.network;
  StageLoss loss{};  // the whole round's, with every part
  CopyLoss(r, &loss);
  loss.loss_bound_ppm = static_cast<uint32_t>(std::lround(r.loss_bound * wire::kPpm));
  // The classes of the chunks that start in this part (a bounded step holds kStageMaxClasses at most).
  const uint64_t chunk_elems = limits_.bounded_step_elems / kStageMaxClasses;
  std::vector<uint8_t> classes;
  if (chunk_elems > 0) {
    const uint64_t first = (spec.offset + chunk_elems - 1) / chunk_elems;
    const uint64_t end = std::min<uint64_t>((spec.offset + spec.elems + chunk_elems - 1) / chunk_elems, r.classes.size());
    if (first < end) classes.assign(r.classes.begin() + static_cast<ptrdiff_t>(first), r.classes.begin() + static_cast<ptrdiff_t>(end));
  }
  steps_.PostLoss(step, loss, classes);
}

void HostStage::EndStep(Pending p) {
  Running& run = *p.run;
  auto out = [&](const float* result) {
    // The first worker's leg posted the round's losses (not with a sum step: the round runs after).
    if (run.stats.loss_bound > 0 && LegElsewhere() && p.phase != Phase::kSum) {
      run.heard = steps_.loss(p.begun.step);  // the op's one round's
      if (run.op.options.report_classes) {
        const std::vector<uint8_t> classes = steps_.classes(p.begun.step);
        run.classes.insert(run.classes.end(), classes.begin(), classes.end());
      }
    }
    if (p.phase == Phase::kResult) Trace(run, "result in", MonotonicNow(), StepArgs(p.spec));
    return p.io.out(result);
  };
  // The first worker waits for its network leg to end even when the job failed: the engine ends
  // it soon after (its rounds hear of the failure) or by the op's deadline, and until then it may
  // write into the step's bank, and the key has an op in flight that no next leg may overlap.
  const bool leads = steps_.first() && network_ != nullptr;
  const absl::Status status = steps_.End(p.begun, out, run.deadline, [this, leads] {
    return leads ? Stopped() : Interrupted();
  });
  if (status.ok() && p.leg != nullptr && p.leg->ok()) TakeLegStats(**p.leg, &run.stats);
  if (!status.ok()) StepFailed(run, status);
  if (status.ok() && p.phase != Phase::kSum) {
    Trace(run, "result out", MonotonicNow(), absl::StrCat("\"step\":", p.begun.step));
  }
  StepGone(run);
}

void HostStage::StepFailed(Running& run, const absl::Status& status) {
  run.Fail(status);
  // The round's sum will not be made: the engine fails it rather than push a part of it.
  if (run.round != nullptr) run.round->gate()->Abandon(run.failure());
  if (absl::Status gone = steps_.Gone(); !gone.ok()) {
    std::function<void(const absl::Status&)> broken;
    {
      std::lock_guard<std::mutex> lock(mu_);
      broken = std::exchange(broken_, nullptr);
    }
    if (broken) broken(gone);
  }
}

void HostStage::StepGone(Running& run) {
  if (--run.steps_left == 0) Complete(run);
}

void HostStage::Complete(Running& run) {
  if (absl::Status failed = run.failure(); !failed.ok()) {
    TraceEnd(run, failed);
    return run.op.done(failed);
  }
  const Op& op = run.op;
  if (LegElsewhere()) elsewhere_(op.key, InTwoPhases(op) ? 1 : static_cast<uint32_t>(StepsOf(op)));
  if (run.heard) {
    CopyLoss(*run.heard, &run.stats);
    run.stats.loss_bound = std::max(run.stats.loss_bound, static_cast<double>(run.heard->loss_bound_ppm) / wire::kPpm);
  }
  if (run.heard && op.options.report_classes) run.stats.classes = std::move(run.classes);
  // An empty op completes on the beginning thread, and has no chunks: the ending thread's
  // classes_ are not for it.
  absl::Status classed = op.elems() == 0 ? absl::OkStatus() : ClassWholeJob(run);
  TraceEnd(run, classed);
  if (!classed.ok()) return run.op.done(classed);
  run.stats.time = MonotonicNow() - run.start;
  run.op.done(std::move(run.stats));
}

void HostStage::NoteCame(const BegunStep& begun) {
  if (lateness_ == nullptr) return;
  const std::vector<absl::Time> came = steps_.Came(begun);
  const absl::Time first = *std::min_element(came.begin(), came.end());
  std::vector<uint32_t> delivered_us;  // after the first, and 0 means "never": from 1
  for (absl::Time t : came) {
    delivered_us.push_back(static_cast<uint32_t>(std::min<int64_t>(absl::ToInt64Microseconds(t - first), UINT32_MAX - 1)) + 1);
  }
  lateness_->NoteRound(delivered_us);
}

std::vector<RankLateness> HostStage::MemberLateness() const {
  if (lateness_ == nullptr) return {};
  std::vector<RankLateness> out = lateness_->Ranks(MonotonicNanos());
  for (RankLateness& r : out) r.rank = ranks()[r.rank];
  return out;
}

void HostStage::TraceBegin(const Running& run) const {
  if (!limits_.timeline) return;
  const Op& op = run.op;
  limits_.timeline->Begin(
      run.trace_id, SpanName(op.key, op.options), run.start,
      absl::StrCat("\"key\":", op.key, ",\"round\":", run.stats.round, ",\"elems\":", op.elems(), ",\"steps\":",
                   StepsOf(op), ",\"host_stage\":", ranks().size(), ",\"network_legs\":", Networked() ? "true" : "false",
                   ",\"loss_bound\":", run.stats.loss_bound));
}

void HostStage::Trace(const Running& run, const char* what, absl::Time t, std::string args) const {
  if (limits_.timeline) limits_.timeline->Instant(run.trace_id, what, t, std::move(args));
}

void HostStage::TraceEnd(const Running& run, const absl::Status& status) const {
  if (!limits_.timeline) return;
  const Op& op = run.op;
  std::string args = status.ok() ? "" : absl::StrCat("\"error\":", Json(status.ToString()));
  limits_.timeline->End(run.trace_id, SpanName(op.key, op.options), MonotonicNow(),
                        std::move(args));
}

absl::Status HostStage::ClassWholeJob(Running& run) {
  const Op& op = run.op;
  if (Networked() || run.stats.loss_bound <= 0 || op.root >= 0) return absl::OkStatus();
  StageClasses::Values values{op.data.data(), ElemType::kF32, op.data.size(), -1};
  if (op.device) values = {op.device->data, op.device->type, op.device->elems, op.device->device};
  absl::Status s = classes_.Fill(values, op.key, op.options.layer, run.stats.loss_bound, op.options.report_classes,
                                 &run.stats);
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("host stage: classing key ", op.key, "'s chunks: ", s.message()));
}

uint64_t HostStage::StepElemsOf(const Op& op) const {
  const bool bounded = op.options.loss_bound > 0 && limits_.bounded_step_elems > 0;
  return bounded ? std::min(steps_.slot_elems(), limits_.bounded_step_elems) : steps_.slot_elems();
}

StepIo HostStage::IoOf(const Op& op, const StepSpec& spec, Phase phase) const {
  StepIo io = IoOf(op, spec);
  if (phase == Phase::kSum) io.out = [](const float*) { return absl::OkStatus(); };  // the result comes later
  if (phase == Phase::kResult) io.in = nullptr;  // nothing is summed
  return io;
}

StepIo HostStage::IoOf(const Op& op, const StepSpec& spec) const {
  if (!op.device) return HostStepIo(op.data.data() + spec.offset, op.data.data() + spec.offset, spec.elems);
  const DeviceTensor t = *op.device;
  char* part = static_cast<char*>(t.data) + spec.offset * ElemWidth(t.type);
  auto named = [key = op.key](const char* what, const absl::Status& s) {
    return s.ok() ? s : absl::Status(s.code(), absl::StrCat("host stage: ", what, " key ", key, "'s device tensor: ",
                                                             s.message()));
  };
  StepIo io;
  io.in = [=](float* slot) { return named("reading", LoadFromDevice(part, spec.elems, t.type, slot, t.device)); };
  io.out = [=](const float* result) {
    return named("writing the result into", StoreToDevice(result, spec.elems, t.type, part, t.device));
  };
  return io;
}

void HostStage::PinForDevice(int device) {
  if (std::exchange(pin_tried_, true)) return;
  const absl::Status pinned = PinHostMemory(steps_.region(), steps_.region_bytes(), device);
  pinned_ = pinned.ok();
  if (!pinned_) {
    DLCP_LOG(Warning) << "host stage: could not pin the shared region for device copies (" << pinned
                      << "); they go through the CUDA runtime's staging buffers instead";
  }
}

void HostStage::StartLeg(float* sum, const StepSpec& spec, uint64_t step, const Running& run, bool post_loss,
                         std::shared_ptr<absl::StatusOr<RoundStats>> out, LegDone done, std::shared_ptr<LegGate> gate) {
  const Op& op = run.op;
  // A broadcast from a rank of this stage: the bank holds its values, which this worker pushes as
  // the root; from another host's rank, the bank holds zeros, and the root's come back.
  int64_t root = op.root;
  if (root >= 0 && std::find(ranks().begin(), ranks().end(), static_cast<uint32_t>(root)) != ranks().end()) {
    root = ranks()[0];
  }
  // The engine ends its op by the op's deadline (or at Stop, which a closing client calls after the
  // stage's and before the stage's memory is unmapped), and runs this on its own thread.
  legs_in_flight_.fetch_add(1);
  const uint64_t id = run.trace_id;
  if (limits_.timeline) limits_.timeline->Instant(id, "network leg", MonotonicNow());
  network_(spec.key, absl::MakeSpan(sum, spec.elems), op.options, root, std::move(gate),
           [this, step, id, bounded = post_loss && spec.loss_bound_ppm > 0, out = std::move(out),
            done = std::move(done)](absl::StatusOr<RoundStats> r) {
             if (r.ok() && bounded) {  // the others report it as theirs
               StageLoss loss{};
               CopyLoss(*r, &loss);
               loss.loss_bound_ppm = static_cast<uint32_t>(std::lround(r->loss_bound * wire::kPpm));
               steps_.PostLoss(step, loss, r->classes);
             }
             const absl::Status status = r.status();
             if (limits_.timeline) limits_.timeline->Instant(id, "network leg done", MonotonicNow());
             *out = std::move(r);
             done(status);
             legs_in_flight_.fetch_sub(1);  // the last use of this stage
           });
}

}  // namespace dlcp
