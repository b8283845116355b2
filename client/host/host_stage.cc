#include "client/host/host_stage.h"

#include <algorithm>
#include <cmath>
#include <future>
#include <utility>
#include <memory>

#include "absl/strings/str_cat.h"
#include "client/packer/packer.h"
#include "common/base/clock.h"
#include "common/base/log.h"
#include "common/wire/bounded.h"

namespace dlcp {
namespace {

// The engine completes its op by the op deadline; its completion may come just after.
constexpr absl::Duration kLegGrace = absl::Seconds(5);

void AddLegStats(const RoundStats& leg, RoundStats* total) {
  total->chunks += leg.chunks;
  total->retransmits += leg.retransmits;
  total->nacks_deferred += leg.nacks_deferred;
  total->result_requests += leg.result_requests;
  total->window_cuts += leg.window_cuts;
  total->window_undos += leg.window_undos;
  total->losses_tolerated += leg.losses_tolerated;
  total->bytes_sent += leg.bytes_sent;
  total->bytes_received += leg.bytes_received;
  total->injected_drops += leg.injected_drops;
  total->min_contributors = std::min(total->min_contributors, leg.min_contributors);
  total->slowest_rank = leg.slowest_rank;
  total->slowest_lateness = leg.slowest_lateness;
  for (size_t c = 0; c < leg.chunks_by_class.size(); ++c) {
    total->chunks_by_class[c] += leg.chunks_by_class[c];
    total->left_out_by_class[c] += leg.left_out_by_class[c];
  }
  total->droppable_total += leg.droppable_total;
  total->droppable_missing += leg.droppable_missing;
  total->bound_violations += leg.bound_violations;
  total->pull_missing += leg.pull_missing;
  total->time_to_stop = std::max(total->time_to_stop, leg.time_to_stop);
  total->tail_wait = std::max(total->tail_wait, leg.tail_wait);
  total->classes.insert(total->classes.end(), leg.classes.begin(), leg.classes.end());
}

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

}  // namespace

HostStage::HostStage(StageMembership membership, NetworkSubmit network, RoundsElsewhere elsewhere, uint32_t world,
                     absl::Duration op_timeout, std::function<void(const absl::Status&)> broken)
    : steps_(std::move(membership)),
      network_(std::move(network)),
      elsewhere_(std::move(elsewhere)),
      world_(world),
      op_timeout_(op_timeout),
      broken_(std::move(broken)) {
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
  if (thread_.joinable()) thread_.join();
  steps_.Leave();  // a closed client is gone for the others, though its process may live on
}

void HostStage::FailJob(const absl::Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (job_failure_.ok()) job_failure_ = why;
  job_failed_.store(true);
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

void HostStage::Run() {
  for (;;) {
    Op op;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !queue_.empty() || !stopped_.ok(); });
      if (!stopped_.ok()) {
        std::deque<Op> left = std::move(queue_);
        const absl::Status why = stopped_;
        lock.unlock();
        for (Op& o : left) o.done(why);
        return;
      }
      op = std::move(queue_.front());
      queue_.pop_front();
    }
    op.done(RunOp(op));
  }
}

absl::StatusOr<RoundStats> HostStage::RunOp(const Op& op) {
  const absl::Time start = MonotonicNow();
  const absl::Time deadline = start + op_timeout_;
  RoundStats stats;
  stats.key = op.key;
  stats.round = rounds_[op.key]++;
  stats.min_contributors = world_;  // the first worker's network legs may say otherwise
  stats.loss_bound = std::max(0.0, op.options.loss_bound);
  const auto bound_ppm = static_cast<uint32_t>(std::lround(stats.loss_bound * wire::kPpm));
  const uint32_t kind = op.root >= 0 ? static_cast<uint32_t>(op.root) + 1 : 0;
  std::optional<StageLoss> heard;  // a bounded op's losses, from the first worker's leg
  std::vector<uint8_t> classes;    // ... and its chunks' classes
  // A failed job fails the op at once, as on the network path; its steps are still gone through.
  absl::Status status = Interrupted();
  if (op.device) PinForDevice(op.device->device);
  for (uint64_t offset = 0; offset < op.elems(); offset += steps_.slot_elems()) {
    StepSpec spec{op.key, kind, offset, std::min<uint64_t>(steps_.slot_elems(), op.elems() - offset), op.elems(),
                  bound_ppm};
    if (!status.ok()) {  // the op failed: the rest of its steps are given up, so every worker stays in step
      steps_.Skip(spec, status).IgnoreError();  // it is `status` again
      continue;
    }
    NetworkLeg leg;
    if (network_) leg = [&](float* sum, const StepSpec& s) { return Leg(sum, s, op, deadline, &stats); };
    StepIo io = IoOf(op, spec);
    if (bound_ppm > 0 && LegElsewhere()) {
      io.out = [&, out = std::move(io.out)](const float* result) {
        heard = steps_.loss();
        if (op.options.report_classes) classes = steps_.classes();
        return out(result);
      };
    }
    status = steps_.Run(spec, io, leg, deadline, [this] { return Interrupted(); });
    if (!status.ok() && broken_ && !steps_.Gone().ok()) std::exchange(broken_, nullptr)(steps_.Gone());
  }
  if (!status.ok()) return status;
  if (LegElsewhere()) elsewhere_(op.key, static_cast<uint32_t>((op.elems() + steps_.slot_elems() - 1) / steps_.slot_elems()));
  if (heard) CopyLoss(*heard, &stats);
  if (heard && op.options.report_classes) stats.classes = std::move(classes);
  stats.time = MonotonicNow() - start;
  return stats;
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

absl::Status HostStage::Leg(float* sum, const StepSpec& spec, const Op& op, absl::Time deadline, RoundStats* stats) {
  // A broadcast from a rank of this stage: slot 0 holds its values, which this worker pushes as
  // the root; from another host's rank, slot 0 holds zeros, and the root's come back.
  int64_t root = op.root;
  if (root >= 0 && std::find(ranks().begin(), ranks().end(), static_cast<uint32_t>(root)) != ranks().end()) {
    root = ranks()[0];
  }
  auto result = std::make_shared<std::promise<absl::StatusOr<RoundStats>>>();
  std::future<absl::StatusOr<RoundStats>> done = result->get_future();
  network_(spec.key, absl::MakeSpan(sum, spec.elems), op.options, root,
           [result](absl::StatusOr<RoundStats> r) { result->set_value(std::move(r)); });
  while (done.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
    // The engine ends the op by its deadline. A closing client stops the engine after the stage
    // and unmaps the stage's memory only then, so the op may go on writing into slot 0 until.
    if (absl::Status stop = Interrupted(); !stop.ok()) return stop;
    if (MonotonicNow() > deadline + kLegGrace) {
      return absl::DeadlineExceededError(absl::StrCat("host stage: the network leg of key ", spec.key,
                                                      " did not end by its deadline"));
    }
  }
  absl::StatusOr<RoundStats> r = done.get();
  if (!r.ok()) return r.status();
  AddLegStats(*r, stats);
  if (spec.loss_bound_ppm > 0) {  // the others report it as theirs
    StageLoss loss{};
    CopyLoss(*r, &loss);
    steps_.PostLoss(loss, r->classes);
  }
  return absl::OkStatus();
}

}  // namespace dlcp
