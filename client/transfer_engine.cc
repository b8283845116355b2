#include "client/transfer_engine.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "common/base/json_text.h"
#include "common/base/log.h"
#include "common/datapath/quiet_spell.h"
#include "common/wire/bounded.h"
#include "common/wire/ranges.h"

namespace dlcp {
namespace {
constexpr size_t kPushBudget = 256;  // pushes per loop turn, so receives are never starved
constexpr int kMaxRepairBackoff = 16;

std::vector<Topology::Aggregator> TopologyAggregators(const EngineOptions& o) {
  std::vector<Topology::Aggregator> out;
  for (size_t i = 0; i < o.endpoints.size(); ++i) {
    out.push_back({o.aggregator_ids[i], static_cast<uint32_t>(o.endpoints[i].size())});
  }
  return out;
}
// An op's span on the timeline: its key and round (a key has one op in flight at a time).
uint64_t TraceId(const TransferOp& op) { return uint64_t{op.key} << 32 | op.round; }
std::string TraceName(const TransferOp& op) { return op.name.empty() ? absl::StrCat("key ", op.key) : op.name; }

}  // namespace

TransferEngine::TransferEngine(const EngineOptions& options, std::unique_ptr<Transport> transport)
    : options_(options),
      transport_(std::move(transport)),
      routing_{Topology(TopologyAggregators(options))},
      outbox_(transport_.get()),
      injector_(options.inject),
      phase_(options.phase_aware) {
  // Client::Connect validated the options, so this cannot fail; uniform class 1 is the fallback.
  PackerOptions packer{PackerOptions::Device::kCpu, 0, options_.class_policy};
  absl::StatusOr<std::unique_ptr<Packer>> created = CreatePacker(packer);
  if (!created.ok()) {
    packer.policy = {ClassPolicyOptions::Kind::kUniform, 0, 1};
    created = CreatePacker(packer);
  }
  options_.class_policy = packer.policy;
  packer_ = std::move(*created);
  BuildDestinations();
  io_ = std::thread([this] { Run(); });
}

void TransferEngine::BuildDestinations() {
  routing_.topology = Topology(TopologyAggregators(options_));
  flows_.clear();
  // Sized once per layout: the flows' keys point into them, and ApplyLatestKeys only assigns.
  options_.previous_keys.resize(options_.keys.size());
  options_.key_generations.resize(options_.keys.size());
  options_.worker_keys.resize(options_.keys.size());
  routing_.dest_by_addr.clear();
  routing_.dest_base.clear();
  routing_.plans.clear();
  // A new layout is a new set of paths: every window starts again.
  CongestionOptions cc;
  cc.decrease = kWindowDecrease;
  cc.max = std::max<uint32_t>(1, options_.window_chunks);
  cc.min = std::min<uint32_t>(cc.min, cc.max);
  PacerOptions pacing;
  pacing.burst = std::max<uint32_t>(1, options_.path_burst);
  DelaySignalOptions delay;
  delay.capacity = 2 * size_t{cc.max} + 64;  // first pushes in flight, and repairs' stamps between
  delay.floor = options_.congestion_delay;
  for (size_t a = 0; a < options_.endpoints.size(); ++a) {
    routing_.dest_base.push_back(static_cast<uint32_t>(flows_.size()));
    for (size_t e = 0; e < options_.endpoints[a].size(); ++e) {
      const Address& ep = options_.endpoints[a][e];
      routing_.dest_by_addr[ep] = static_cast<uint32_t>(flows_.size());
      if (a < options_.sources.size() && e < options_.sources[a].size()) {
        for (const Address& s : options_.sources[a][e]) routing_.dest_by_addr[s] = static_cast<uint32_t>(flows_.size());
      }
      flows_.push_back(DestFlow{ep, options_.epochs[a], options_.keys[a] ? &*options_.keys[a] : nullptr,
                                options_.previous_keys[a] ? &*options_.previous_keys[a] : nullptr, SignKey(a),
                                CongestionWindow(cc), Pacer(pacing), DelaySignal(delay)});
    }
  }
  ApplyLatestKeys();
  BuildPaths();
  BuildNackFilters();
}

const std::string& TransferEngine::AggregatorOf(uint32_t dest) const {
  const std::vector<uint32_t>& base = routing_.dest_base;
  const size_t a = std::upper_bound(base.begin(), base.end(), dest) - base.begin() - 1;
  return options_.aggregator_ids[a];
}

uint32_t TransferEngine::WindowOf(uint32_t dest) const {
  return options_.adaptive_window ? flows_[dest].window.window() : options_.window_chunks;
}

TransferEngine::~TransferEngine() { Stop(absl::CancelledError("dlcp client closed")); }

void TransferEngine::Submit(uint32_t key, absl::Span<float> data, const AllReduceOptions& options,
                            int64_t broadcast_root, OpDone done, StageLeg leg) {
  auto op = std::make_unique<Op>();
  op->done = std::move(done);
  if (data.data() == nullptr) return op->done(absl::InvalidArgumentError("AllReduce of an empty tensor"));
  op->data = data.data();
  op->broadcast_root = broadcast_root;
  op->carries = leg.carries;
  op->gate.Hold(std::move(leg.gate), [transport = transport_.get()] { transport->Wake(); });
  Enqueue(std::move(op), key, data.size(), options);
}

void TransferEngine::SubmitDevice(uint32_t key, const DeviceTensor& tensor, const AllReduceOptions& options,
                                  OpDone done) {
  auto op = std::make_unique<Op>();
  op->done = std::move(done);
  if (absl::Status s = DeviceTensorStatus(tensor); !s.ok()) return op->done(s);
  if (tensor.elems <= std::numeric_limits<uint32_t>::max()) {
    op->device = tensor;
    op->staging.resize(tensor.elems);
    op->data = op->staging.data();
  }
  Enqueue(std::move(op), key, tensor.elems, options);
}

void TransferEngine::SkipRounds(uint32_t key, uint32_t rounds) {
  std::lock_guard<std::mutex> lock(mu_);
  shared_.next_round[key] += rounds;
}

void TransferEngine::Enqueue(std::unique_ptr<Op> op, uint32_t key, uint64_t elems, const AllReduceOptions& options) {
  auto fail = [&](absl::Status s) { op->done(std::move(s)); };
  const int64_t broadcast_root = op->broadcast_root;
  if (elems == 0) return fail(absl::InvalidArgumentError("AllReduce of an empty tensor"));
  if (elems > std::numeric_limits<uint32_t>::max()) {
    return fail(absl::InvalidArgumentError(absl::StrCat("tensor of ", elems, " elements exceeds 2^32 - 1")));
  }
  const double bound = options.loss_bound < 0 ? options_.loss_bound : options.loss_bound;
  if (!(bound <= 1)) return fail(absl::InvalidArgumentError(absl::StrCat("loss_bound ", bound, " is not in [0, 1]")));
  op->loss_bound_ppm = static_cast<uint32_t>(std::lround(bound * wire::kPpm));
  op->tensor = TensorInfo{options.layer, options_.num_layers};
  op->report_classes = options.report_classes;
  op->name = options.name;
  op->clock.enqueued = MonotonicNow();
  // A broadcast must replace every replica's data exactly.
  op->encoding = broadcast_root >= 0 ? wire::Encoding::kF32 : options.payload_encoding.value_or(options_.payload_encoding);
  if (static_cast<uint8_t>(op->encoding) >= wire::kNumEncodings) {
    return fail(absl::InvalidArgumentError(absl::StrCat("payload encoding ", static_cast<int>(op->encoding), " is unknown")));
  }
  if (options_.bounded_pull && op->loss_bound_ppm > 0) {
    op->bounded.pull_ppm = static_cast<uint32_t>(std::lround(options_.pull_loss_bound * wire::kPpm));
  }
  absl::Status refused;  // `done` runs outside the lock: it may submit again
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!shared_.error.ok()) {
      refused = shared_.error;
    } else if (!shared_.job_failed.ok()) {
      refused = shared_.job_failed;
    } else if (shared_.stopped) {
      refused = absl::FailedPreconditionError("dlcp client is closed");
    } else if (shared_.active_keys.count(key)) {
      refused = absl::FailedPreconditionError(absl::StrCat("key ", key, " already has an AllReduce in flight"));
    } else if (shared_.active_keys.size() >= options_.max_inflight) {
      refused = absl::ResourceExhaustedError(absl::StrCat(options_.max_inflight,
                                                          " AllReduce ops already in flight (the aggregators' "
                                                          "--max-rounds-in-flight); wait for one to finish"));
    } else {
      op->key = key;
      op->round = shared_.next_round[key]++;
      op->geometry = wire::ChunkGeometry{static_cast<uint32_t>(elems), options_.chunk_bytes / 4};
      shared_.active_keys.insert(key);
      shared_.submitted.push_back(std::move(op));
    }
  }
  if (!refused.ok()) return fail(std::move(refused));
  transport_->Wake();
}

void TransferEngine::FailFatal(const absl::Status& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!shared_.error.ok()) return;
    shared_.error = reason;
  }
  regroup_cv_.notify_all();
  transport_->Wake();
}

void TransferEngine::FailJob(const absl::Status& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!shared_.job_failed.ok()) return;
    shared_.job_failed = reason;
  }
  DLCP_LOG(Warning) << reason;
  transport_->Wake();
}

void TransferEngine::Stop(const absl::Status& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shared_.stopped) return;
    shared_.stopped = true;
  }
  regroup_cv_.notify_all();
  stop_.store(true);
  transport_->Wake();
  if (io_.joinable()) io_.join();
  FailAll(reason);
}

void TransferEngine::FailAll(const absl::Status& reason) {
  std::vector<std::unique_ptr<Op>> started;
  std::deque<std::unique_ptr<Op>> unstarted;
  {
    std::lock_guard<std::mutex> lock(mu_);
    TakeEveryOp(&started, &unstarted);
  }
  FailTaken(started, unstarted, reason);
}

void TransferEngine::FailTaken(std::vector<std::unique_ptr<Op>>& started, std::deque<std::unique_ptr<Op>>& unstarted,
                               const absl::Status& reason) {
  for (auto& op : unstarted) op->done(reason);
  for (auto& op : started) {
    TraceEnd(*op, reason);
    op->done(reason);
  }
}

std::shared_ptr<const TransferEngine::Plan> TransferEngine::PlanFor(uint32_t key, uint32_t tensor_elems) {
  auto it = routing_.plans.find(key);
  if (it != routing_.plans.end() && it->second->tensor_elems == tensor_elems) return it->second;
  auto plan = std::make_shared<Plan>();
  plan->tensor_elems = tensor_elems;
  const wire::ChunkGeometry g{tensor_elems, options_.chunk_bytes / 4};
  const uint32_t chunks = g.chunk_count();
  plan->chunks_by_dest.resize(flows_.size());
  plan->dest_of_chunk.resize(chunks);
  plan->pos_in_dest.resize(chunks);
  const uint32_t blocks = (chunks + kBlockChunks - 1) / kBlockChunks;
  const std::vector<Topology::Owner> owners = routing_.topology.OwnersOfTensor(options_.job, key, blocks);
  for (uint32_t block = 0; block < blocks; ++block) {
    const Topology::Owner& o = owners[block];
    const uint32_t dest = routing_.dest_base[o.aggregator] + o.endpoint;
    for (uint32_t c = block * kBlockChunks; c < std::min(chunks, (block + 1) * kBlockChunks); ++c) {
      plan->pos_in_dest[c] = static_cast<uint32_t>(plan->chunks_by_dest[dest].size());
      plan->chunks_by_dest[dest].push_back(c);
      plan->dest_of_chunk[c] = static_cast<uint16_t>(dest);
    }
  }
  routing_.plans[key] = plan;
  return plan;
}

wire::Header TransferEngine::BaseHeader(wire::MsgType type, uint32_t dest, uint32_t key, uint32_t round,
                                        uint32_t elems, uint32_t chunks) const {
  wire::Header h;
  h.type = type;
  h.priority = 0;
  h.job = options_.job;
  h.key = key;
  h.round = round;
  h.chunk_count = chunks;
  h.tensor_elems = elems;
  h.rank = static_cast<uint16_t>(options_.rank);
  h.epoch = flows_[dest].epoch;
  return h;
}

void TransferEngine::TakeSubmissions(absl::Time now) {
  if (shared_.paused) return;  // they start in the layout Resume brings
  std::deque<std::unique_ptr<Op>> fresh;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fresh.swap(shared_.submitted);
  }
  std::deque<std::unique_ptr<Op>> unsummed;  // gated, and waiting for their whole tensor
  for (auto& op : fresh) {
    op->stats.key = op->key;
    op->stats.round = op->round;
    op->stats.loss_bound = static_cast<double>(op->loss_bound_ppm) / wire::kPpm;
    absl::Status s = op->gate.get() ? op->gate.get()->abandoned() : absl::OkStatus();
    if (s.ok() && !op->gate.complete() && !PushesPartly(*op)) {
      unsummed.push_back(std::move(op));
      continue;
    }
    if (s.ok()) s = Prepare(*op);
    if (!s.ok()) {
      {
        // Nothing of the round went out: the key's next op takes its number, as on the others.
        std::lock_guard<std::mutex> lock(mu_);
        shared_.active_keys.erase(op->key);
        shared_.next_round[op->key] = op->round;
      }
      op->done(std::move(s));
      continue;
    }
    if (options_.retain_inputs) RetainInput(*op);
    TraceBegin(*op, now);
    if (auto r = ops_.find(op->key); r != ops_.end() && r->second->retained.replay) {
      held_[op->key] = std::move(op);  // starts once the regroup's replay of its key ends
      continue;
    }
    Launch(*op, now);
    ops_[op->key] = std::move(op);
  }
  if (unsummed.empty()) return;
  // Ahead of what came since, in their order: their gates wake this thread as they open.
  std::lock_guard<std::mutex> lock(mu_);
  shared_.submitted.insert(shared_.submitted.begin(), std::make_move_iterator(unsummed.begin()),
                           std::make_move_iterator(unsummed.end()));
}

bool TransferEngine::PushesPartly(const Op& op) {
  if (op.encoding != wire::Encoding::kF32 || op.loss_bound_ppm > 0 || op.device || op.broadcast_root >= 0) return false;
  if (auto r = residuals_.find(op.key); r != residuals_.end() && !r->second.chunks.empty()) return false;
  // One class for every chunk, from the tensor's layer and size alone (PackHost reads no value then).
  absl::StatusOr<PackLayout> layout = PlanPack(PackInputOf(op, op.data), options_.class_policy);
  return layout.ok() && layout->tiers[0].uniform != kNoUniform;
}

void TransferEngine::Launch(Op& op, absl::Time now) {
  op.plan = PlanFor(op.key, op.geometry.tensor_elems);
  op.chunks.state.assign(op.geometry.chunk_count(), kUnsent);
  op.chunks.stamps.assign(op.geometry.chunk_count(), 0);
  op.chunks.repushes.assign(op.geometry.chunk_count(), 0);
  op.chunks.resending.assign(op.geometry.chunk_count(), 0);
  op.chunks.deferred.assign(op.geometry.chunk_count(), 0);
  op.chunks.paths.assign(Steering() ? op.geometry.chunk_count() : 0, 0);
  op.dests.assign(flows_.size(), Dest{});
  op.remaining = op.geometry.chunk_count();
  op.clock.start = now;
  op.clock.deadline = now + options_.op_timeout;
  op.clock.last_progress = now;
  op.clock.next_repair = now;  // ScanTimers: a quiet spell of the op's own pace decides
  op.clock.repair_attempts = 0;
  op.stats.chunks = op.remaining;
  op.stats.min_contributors = std::numeric_limits<uint32_t>::max();
  op.bounded.class0_pending = static_cast<uint32_t>(op.stats.chunks_by_class[0]);
  op.bounded.droppable_pending = op.bounded.droppable_chunks;
  op.bounded.pull_armed = false;
  op.bounded.stops_pending = 0;
  op.bounded.stopped.clear();
  op.bounded.heard.clear();
  if (op.loss_bound_ppm > 0) {
    op.bounded.stopped.assign(flows_.size(), true);
    op.bounded.heard.assign(flows_.size(), false);
    for (uint32_t d = 0; d < flows_.size(); ++d) {
      if (op.plan->chunks_by_dest[d].empty()) continue;
      op.bounded.stopped[d] = false;
      ++op.bounded.stops_pending;
      SendManifest(op, d);
    }
  }
}

bool TransferEngine::PushSome(size_t budget) {
  StartTurn(budget);
  bool more = false;
  for (auto& [key, op_ptr] : ops_) {
    // A gated op's parts go out as they are summed: once kept for a regroup, where it keeps them
    // (before any result of theirs can come back into `data`).
    const uint64_t ready = op_ptr->gate.ready();
    if (options_.retain_inputs && !op_ptr->retained.replay) KeepInput(*op_ptr, ready);
    for (uint32_t d = 0; d < op_ptr->dests.size(); ++d) more |= PushTo(*op_ptr, d, ready);
  }
  return more;
}

void TransferEngine::StartTurn(size_t budget) {
  PushTurn& t = turn_;
  t.budget = budget;
  t.now = MonotonicNow();
  // The window is the endpoint's, shared by every op pushing there.
  t.inflight.assign(flows_.size(), 0);
  t.repairs.assign(flows_.size(), 0);
  t.allow.assign(flows_.size(), std::numeric_limits<uint32_t>::max());
  if (options_.pacing) {
    for (uint32_t d = 0; d < flows_.size(); ++d) t.allow[d] = flows_[d].pacer.Allowance(t.now);
  }
  for (auto& [key, op_ptr] : ops_) {
    for (uint32_t d = 0; d < op_ptr->dests.size(); ++d) {
      const Dest& dest = op_ptr->dests[d];
      t.inflight[d] += dest.next - dest.acked + dest.repairs_out;
      t.repairs[d] += dest.repairs_out;
    }
  }
}

bool TransferEngine::PushTo(Op& op, uint32_t d, uint64_t ready) {
  PushTurn& t = turn_;
  wire::Header h = BaseHeader(wire::MsgType::kPush, d, op.key, op.round, op.geometry.tensor_elems,
                              op.geometry.chunk_count());
  h.encoding = static_cast<uint8_t>(op.encoding);
  h.contributors = op.carries > 1 ? op.carries : 0;  // a host stage's sum (docs/host-stage.md)
  Dest& dest = op.dests[d];
  const std::vector<uint32_t>& mine = op.plan->chunks_by_dest[d];
  const size_t window = WindowOf(d);
  const uint64_t retransmits_before = op.stats.retransmits;
  // Repairs are not held back by the pacer, only counted by it: they are what the round's tail
  // waits for, and a NACK asks for few at a time.
  while (!dest.resend.empty() && t.budget > 0 && RepairRoom(d, window)) {
    uint32_t c = dest.resend.back();
    dest.resend.pop_back();
    op.chunks.resending[c] = 0;
    if (op.chunks.state[c] == kHave) continue;
    PushChunk(op, d, h, c, /*repair=*/true);
    Spend(d);
    ++dest.repairs_out;
    ++t.inflight[d];
    ++t.repairs[d];
    ++op.stats.retransmits;
    --t.budget;
  }
  while (dest.next < mine.size() && t.inflight[d] < window && t.budget > 0 && t.allow[d] > 0 &&
         ChunkReady(op, mine[dest.next], ready)) {
    uint32_t c = mine[dest.next++];
    ++t.inflight[d];
    if (++op.clock.pushed_once == 1) TraceMoment(op, "first push", t.now);
    if (op.clock.pushed_once == op.geometry.chunk_count()) TraceMoment(op, "last push", t.now);
    // A bounded round may seal before this worker pushed everything; a chunk whose final
    // result is already here is not pushed (and must not count as outstanding again).
    if (op.chunks.state[c] == kHave) continue;
    op.chunks.state[c] = kSent;
    t.firsts.push_back(c);
    Spend(d);
    --t.budget;
  }
  PushByClass(op, d, h);
  if (op.stats.retransmits > retransmits_before) {
    TraceMoment(op, "repairs", t.now, absl::StrCat("\"chunks\":", op.stats.retransmits - retransmits_before));
  }
  const bool repairs_left = !dest.resend.empty() && RepairRoom(d, window);
  const bool pushes_left = dest.next < mine.size() && t.inflight[d] < window && ChunkReady(op, mine[dest.next], ready);
  if (repairs_left || (pushes_left && t.allow[d] > 0)) return true;
  // Held back by the pacer: the loop sleeps until it lets the next one out.
  if (pushes_left) next_pace_ = std::min(next_pace_, flows_[d].pacer.NextSend(t.now));
  return false;
}

// A repair takes a free slot of the window, and when the window is full of chunks still waiting
// for results, repairs have a window's worth of their own: those results often wait for exactly
// these repairs (this worker's, or another's that waits on this one's results in turn), and
// without room every worker's window stalls until a silence. On the congested test bed that stall
// was 70 ms of an idle link in many rounds.
bool TransferEngine::RepairRoom(uint32_t d, size_t window) const {
  return !options_.adaptive_window || turn_.inflight[d] < window || turn_.repairs[d] < window;
}

void TransferEngine::Spend(uint32_t d) {
  if (turn_.allow[d] > 0) --turn_.allow[d];  // the pacer's tokens may go below zero, after repairs
  if (options_.pacing) flows_[d].pacer.OnSent(1);
}

// A turn's first pushes to one endpoint, the chunks of each class together, in chunk order within
// each. A GSO send carries datagrams to one peer in one class on one path, and each push takes its
// path when pushed (runs of path_burst per path). In chunk order, where a bounded round's classes
// alternate from chunk to chunk (each follows its chunk's magnitude), a path's run held every
// class, and the outbox's grouping split it into sends of two or three datagrams. Order within a
// class is what receivers rely on (a later chunk of a class in means an earlier one missing was
// lost; strict priority reorders classes anyway), and the stamps follow the order pushes leave in.
void TransferEngine::PushByClass(Op& op, uint32_t d, wire::Header& h) {
  std::vector<uint32_t>& firsts = turn_.firsts;
  if (op.loss_bound_ppm > 0) {
    std::stable_sort(firsts.begin(), firsts.end(),
                     [&](uint32_t a, uint32_t b) { return op.chunks.classes[a] < op.chunks.classes[b]; });
  }
  for (uint32_t c : firsts) PushChunk(op, d, h, c, /*repair=*/false);
  firsts.clear();
}

// A retransmission rides class 0: its chunk was lost once in its own class, and the aggregator
// asks only for what it must have (the bound, or a reliable round).
void TransferEngine::PushChunk(Op& op, uint32_t d, wire::Header& h, uint32_t c, bool repair) {
  h.chunk = c;
  // A repair keeps its first push's stamp: a result cannot tell which copy it answers (Karn), and
  // taking the repair's would make every chunk pushed since look lost.
  const uint64_t stamp = flows_[d].window.Stamp();
  if (!repair) {
    op.chunks.stamps[c] = stamp;
    flows_[d].delay.OnSent(stamp, turn_.now);
  }
  if (repair && op.chunks.repushes[c] < 255) ++op.chunks.repushes[c];
  op.chunks.deferred[c] = 0;
  const int16_t path = PickPath(d);
  if (path >= 0) {
    flows_[d].paths->OnSent(path, stamp);
    if (!repair) op.chunks.paths[c] = static_cast<uint8_t>(path);
  }
  h.priority = repair ? 0 : op.chunks.classes[c];
  h.flags = repair ? wire::kFlagRepaired : 0;
  h.lost_class = repair ? op.chunks.classes[c] : 0;
  h.payload_len = op.geometry.bytes(c, wire::EncodingWidth(op.encoding));
  op.stats.bytes_sent += wire::kHeaderSize + h.payload_len;
  if (injector_.Drop(h.priority)) {
    ++op.stats.injected_drops;
    return;
  }
  const uint8_t* payload = op.packets.empty() ? reinterpret_cast<const uint8_t*>(op.data + op.geometry.offset(c))
                                              : op.packets.data() + c * op.packet_stride + wire::kHeaderSize;
  absl::Status s = outbox_.Add(flows_[d].addr, h, payload, flows_[d].sign_key, nullptr, path);
  if (!s.ok()) DLCP_LOG(Warning) << "push to " << flows_[d].addr.ToString() << ": " << s;
}

void TransferEngine::Run() {
  std::vector<InMessage> batch;
  absl::Time last_scan = MonotonicNow();
  const absl::Duration tick = std::min(options_.repair_timeout / 4, absl::Milliseconds(5));
  while (!stop_.load(std::memory_order_relaxed)) {
    bool job_failed = false;
    absl::Status fail_ops;  // set only when there are ops to fail
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!shared_.error.ok()) break;  // FailFatal: the loop ends and every op fails with the error
      job_failed = !shared_.job_failed.ok();
      if (job_failed && (!shared_.submitted.empty() || !ops_.empty() || !held_.empty())) fail_ops = shared_.job_failed;
    }
    // The job lost a worker: nothing can finish until it is back (ServeRejoin).
    if (!fail_ops.ok()) FailAll(fail_ops);
    ServeRegroup(MonotonicNow());
    ServeKeys();
    ServeRejoin(MonotonicNow());
    TakeSubmissions(MonotonicNow());
    next_pace_ = absl::InfiniteFuture();
    bool more = !shared_.paused && !job_failed && PushSome(kPushBudget);
    absl::Status s = outbox_.Flush();
    if (!s.ok() && s.code() != absl::StatusCode::kDeadlineExceeded) {
      std::lock_guard<std::mutex> lock(mu_);
      shared_.error = s;
      break;
    }
    absl::Duration wait = more ? absl::ZeroDuration() : (ops_.empty() ? absl::Milliseconds(100) : tick);
    if (next_tail_ != absl::InfiniteFuture()) wait = std::clamp(next_tail_ - MonotonicNow(), absl::ZeroDuration(), wait);
    if (next_pace_ != absl::InfiniteFuture()) wait = std::clamp(next_pace_ - MonotonicNow(), absl::ZeroDuration(), wait);
    s = transport_->Receive(&batch, wait);
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(mu_);
      shared_.error = absl::Status(s.code(), absl::StrCat("dlcp data plane failed: ", s.message()));
      break;
    }
    const absl::Time now = MonotonicNow();
    // Paused, the old layout's packets; failed, the abandoned rounds': nothing of them may count.
    if (shared_.paused || job_failed) continue;
    for (const InMessage& m : batch) HandleDatagram(m, now);
    if (now - last_scan >= tick || now >= next_tail_) {
      ScanTimers(now);
      last_scan = now;
    }
  }
  if (absl::Status s = outbox_.Flush(); !s.ok()) DLCP_LOG(Warning) << "final flush: " << s;
  regroup_cv_.notify_all();  // a PauseForRegroup waiting on this thread learns why it ended
  absl::Status err;
  {
    std::lock_guard<std::mutex> lock(mu_);
    err = shared_.error;
  }
  if (!err.ok()) {
    DLCP_LOG(Error) << err;
    FailAll(err);
  }
}

void TransferEngine::HandleDatagram(const InMessage& m, absl::Time now) {
  wire::Header h;
  if (const wire::Reject why = wire::ParseHeader(absl::MakeConstSpan(m.data, m.len), &h); why != wire::Reject::kNone) {
    return Reject(why);
  }
  if (h.job != options_.job) return Reject(wire::Reject::kUnknownJob);
  if (h.rank != options_.rank) return Reject(wire::Reject::kNotMember);
  auto src = routing_.dest_by_addr.find(m.from);
  if (src == routing_.dest_by_addr.end()) return Reject(wire::Reject::kUnknownSource);
  const uint32_t from_dest = src->second;
  if (h.epoch != flows_[from_dest].epoch) return Reject(wire::Reject::kStaleEpoch);
  if (const wire::MacKey* key = flows_[from_dest].key) {
    if (!(h.flags & wire::kFlagMac)) return Reject(wire::Reject::kMissingMac);
    if (!wire::VerifyMacEither(*key, flows_[from_dest].prev_key, absl::MakeConstSpan(m.data, m.len), h.payload_len)) {
      return Reject(wire::Reject::kBadMac);
    }
  }
  auto it = ops_.find(h.key);
  Op* op = (it != ops_.end() && it->second->round == h.round) ? it->second.get() : nullptr;
  if (op != nullptr && (h.tensor_elems != op->geometry.tensor_elems || h.chunk_count != op->geometry.chunk_count())) {
    Reject(wire::Reject::kShapeMismatch);
    return;
  }
  const uint8_t* payload = m.data + wire::kHeaderSize;
  switch (h.type) {
    case wire::MsgType::kResult:
      if (op != nullptr) {
        if (!op->bounded.heard.empty()) op->bounded.heard[from_dest] = true;
        return HandleResult(*op, h, m, now);
      }
      break;
    case wire::MsgType::kPushNack:
      if (op != nullptr) return HandleNack(*op, h, payload, from_dest);
      break;
    case wire::MsgType::kStop:
      if (op != nullptr && op->loss_bound_ppm > 0) return HandleStop(*op, h, payload, from_dest, now);
      break;
    case wire::MsgType::kProbe:
      if (op != nullptr) return SendResultReq(*op, from_dest, false);
      break;
    case wire::MsgType::kError: {
      absl::StatusCode code = absl::StatusCode::kAborted;
      std::string text(reinterpret_cast<const char*>(payload), h.payload_len);
      if (!text.empty() && static_cast<uint8_t>(text[0]) < 17) {
        code = static_cast<absl::StatusCode>(text[0]);
        text.erase(0, 1);
      }
      // Named by the control address it was configured with, not the data port it sent from.
      absl::Status error(code, absl::StrCat("aggregator ", AggregatorOf(from_dest), ": ", text));
      // ABORTED means the job itself failed: every op, now and later, fails the same way.
      if (code == absl::StatusCode::kAborted) return FailJob(error);
      if (op == nullptr) break;
      // The op is given up: every aggregator of it may release the round (a refused one holds the
      // blocks it took before the refusal, and would take more from late pushes once memory frees).
      if (h.round == op->round) SendDoneToAll(*op);
      // Moved, not copied: the caller's thread then owns the only reference to the message.
      return Finish(h.key, std::move(error));
    }
    default:
      break;
  }
  // Not for an op in flight. A result or probe for a round this worker has finished means the
  // aggregator missed our DONE: say it again.
  auto done = completed_round_.find(h.key);
  if ((h.type == wire::MsgType::kResult || h.type == wire::MsgType::kProbe || h.type == wire::MsgType::kStop) &&
      done != completed_round_.end() &&
      h.round == done->second) {
    return SendDone(h.key, h.round, from_dest, h.tensor_elems, h.chunk_count);
  }
  Reject(wire::Reject::kUnknownRound);
}

void TransferEngine::HandleResult(Op& op, const wire::Header& h, const InMessage& m, absl::Time now) {
  const uint32_t c = h.chunk;
  const uint32_t dest = op.plan->dest_of_chunk[c];
  // Results come in the encoding the aggregator's round started with, which is normally the op's;
  // a round whose every push was lost (ε = 1) answers zeros in float32. Either decodes.
  const auto encoding = static_cast<wire::Encoding>(h.encoding);
  if (h.payload_len != op.geometry.bytes(c, wire::EncodingWidth(encoding))) {
    Reject(wire::Reject::kLengthMismatch);
    return;
  }
  auto from = routing_.dest_by_addr.find(m.from);
  if (from == routing_.dest_by_addr.end() || from->second != dest) {
    Reject(wire::Reject::kUnknownSource);
    if (!warned_source_) {
      warned_source_ = true;
      DLCP_LOG(Warning) << "result for chunk " << c << " came from " << m.from.ToString() << ", but that chunk's "
                        << "aggregator endpoint is " << flows_[dest].addr.ToString()
                        << "; dropping it. On a multi-homed aggregator, set dlcpd --advertise-host to the address "
                        << "it sends from.";
    }
    return;
  }
  if (op.chunks.state[c] == kHave) return;  // a duplicate; the first copy was identical
  float* out = op.data + op.geometry.offset(c);
  if (h.flags & wire::kFlagLeftOut) {
    ++op.stats.left_out_by_class[op.chunks.classes[c]];
    if (options_.error_feedback && !op.retained.replay) {  // the original round took care of its own
      Residual& r = ResidualOf(op);
      if (r.values.size() != op.geometry.tensor_elems) r.values.assign(op.geometry.tensor_elems, 0.0f);
      float* keep = r.values.data() + op.geometry.offset(c);
      for (uint32_t i = 0; i < op.geometry.elems(c); ++i) keep[i] += out[i];
      r.chunks.push_back(c);
      if (options_.retain_inputs) op.retained.left_out.push_back(c);
    }
  }
  wire::DecodeValues(m.data + wire::kHeaderSize, op.geometry.elems(c), encoding, out);
  if (options_.rescale && h.contributors > 0 && h.contributors < options_.world) {
    const float scale = static_cast<float>(options_.world) / h.contributors;
    for (uint32_t i = 0; i < op.geometry.elems(c); ++i) out[i] *= scale;
  }
  op.chunks.state[c] = kHave;
  // Someone's push of it was lost (repaired, or left out of a sealed round) in a class at least
  // as important as this worker's: in the queue this worker's push took, or one served first.
  const bool lost = (h.flags & wire::kFlagRepaired) && h.lost_class <= op.chunks.classes[c];
  // A result that waited for a repair, or for a seal, says nothing about the path's round trip.
  if (!(h.flags & (wire::kFlagRepaired | wire::kFlagLeftOut)) && op.chunks.repushes[c] == 0) {
    flows_[dest].delay.OnAnswered(op.chunks.stamps[c], now);
  }
  if ((h.flags & wire::kFlagRepaired) && h.lost_class == 0) NoteClassZeroLoss(op, c);
  OnResultPosition(op, dest, op.plan->pos_in_dest[c], lost);
  flows_[dest].pacer.OnDelivered(1, now);
  (op.chunks.classes[c] == 0 ? op.bounded.class0_pending : op.bounded.droppable_pending)--;
  op.stats.bytes_received += m.len;
  op.stats.min_contributors = std::min<uint32_t>(op.stats.min_contributors, h.contributors);
  if (op.remaining == op.geometry.chunk_count()) op.clock.first_result = now;
  op.clock.last_progress = now;
  op.clock.repair_attempts = 0;
  --op.remaining;
  MaybeComplete(op, now);
}

void TransferEngine::SendDoneToAll(const Op& op) {
  for (uint32_t d = 0; d < op.dests.size(); ++d) {
    if (!op.plan->chunks_by_dest[d].empty()) {
      SendDone(op.key, op.round, d, op.geometry.tensor_elems, op.geometry.chunk_count());
    }
  }
}

void TransferEngine::Complete(Op& op, absl::Time now) {
  SendDoneToAll(op);
  completed_round_[op.key] = op.round;
  op.stats.time = now - op.clock.start;
  if (op.device) {
    // The aggregate goes back where the tensor lives before anyone hears of completion.
    absl::Status s = StoreToDevice(op.data, op.geometry.tensor_elems, op.device->type, op.device->data,
                                   op.device->device);
    if (!s.ok()) {
      outbox_.Flush().IgnoreError();
      return Finish(op.key, absl::Status(s.code(), absl::StrCat("writing key ", op.key, "'s result to the device: ",
                                                                s.message())));
    }
  }
  // The DONEs go on the wire before the caller hears of completion: a caller may close the client
  // at once, and an aggregator that never hears DONE holds the round until it expires.
  if (absl::Status s = outbox_.Flush(); !s.ok()) DLCP_LOG(Warning) << "done: " << s;
  Finish(op.key, op.stats);
}

void TransferEngine::HandleNack(Op& op, const wire::Header& h, const uint8_t* payload, uint32_t from_dest) {
  absl::StatusOr<std::vector<wire::ChunkRange>> ranges =
      wire::DecodeRanges(absl::MakeConstSpan(payload, h.payload_len), op.geometry.chunk_count());
  if (!ranges.ok()) {
    Reject(wire::Reject::kBadPayload);
    return;
  }
  // An empty NACK: the aggregator lacks part of this worker's manifest.
  if (op.loss_bound_ppm > 0) op.bounded.heard[from_dest] = true;
  if (ranges->empty() && op.loss_bound_ppm > 0) return SendManifest(op, from_dest);
  if (options_.timeline) {
    uint64_t asked = 0;
    for (const wire::ChunkRange& r : *ranges) asked += r.length;
    TraceMoment(op, "nack", MonotonicNow(),
                absl::StrCat("\"chunks\":", asked, ",\"aggregator\":", Json(AggregatorOf(from_dest))));
  }
  for (const wire::ChunkRange& r : *ranges) {
    for (uint32_t c = r.first; c < r.first + r.length; ++c) {
      // Only chunks already pushed: the rest go out under the window anyway. A chunk asked for
      // twice before it went again goes once.
      if (op.chunks.state[c] != kSent || op.chunks.resending[c]) continue;
      // In a reliable round, one that may still be on its way waits for the next NACK
      // (nack_filter.h). A repair's stamp is its first push's, so only a first push can be known
      // lost. A bounded round's aggregator asks for each chunk once while data flows, and again
      // only once the round goes quiet: waiting for that cost more than the duplicates.
      if (op.loss_bound_ppm == 0 && flows_[from_dest].nack_filter && !op.chunks.deferred[c] &&
          (op.chunks.repushes[c] > 0 ||
           !flows_[from_dest].nack_filter->KnownLost(Steering() ? op.chunks.paths[c] : 0, op.chunks.classes[c],
                                                     op.chunks.stamps[c]))) {
        op.chunks.deferred[c] = 1;
        ++op.stats.nacks_deferred;
        continue;
      }
      // Not a loss signal for the window: it comes a quiet spell after the loss, and in a
      // reliable round mostly says that some worker is slow (transfer_window.cc reads losses
      // from the results instead).
      op.chunks.resending[c] = 1;
      op.dests[op.plan->dest_of_chunk[c]].resend.push_back(c);
    }
  }
}

void TransferEngine::SendResultReq(const Op& op, uint32_t dest, bool done_only, const std::vector<uint8_t>* wanted) {
  std::vector<uint32_t> missing;
  if (!done_only) {
    // At most the endpoint's window, lowest first: every result asked for that is final comes
    // back at once, and more than the path holds overruns a switch queue or our own socket
    // buffer, loses results again and asks again (a repair storm). The configured window alone
    // (thousands of datagrams at MTU 1500) let a worker whose window losses had cut to 4 ask for
    // 3,000 results a time: bursts into 64-packet queues that lost 90% of them, and rounds of
    // 3-54 s on the two-spine bed (docs/congestion.md). At least the initial window, so that a
    // cut window still recovers at a useful pace.
    const size_t cap = std::max<size_t>(WindowOf(dest), std::min(CongestionOptions{}.initial, options_.window_chunks));
    for (uint32_t c : op.plan->chunks_by_dest[dest]) {
      if (missing.size() >= cap) break;
      if (op.chunks.state[c] == kSent && (wanted == nullptr || wanted->empty() || (*wanted)[c])) missing.push_back(c);
    }
    // Nothing pushed there lacks a result yet; a bounded round may still lack its STOP.
    if (missing.empty() && (op.loss_bound_ppm == 0 || op.bounded.stopped[dest])) return;
  }
  wire::Header h = BaseHeader(wire::MsgType::kResultReq, dest, op.key, op.round, op.geometry.tensor_elems,
                              op.geometry.chunk_count());
  // The chunk field says how far this worker has pushed there: 1 + its highest chunk (0: none),
  // so an aggregator can tell a lost tail from one still on its way.
  const Dest& d = op.dests[dest];
  h.chunk = d.next == 0 ? 0 : op.plan->chunks_by_dest[dest][d.next - 1] + 1;
  // One datagram per repair turn: the lowest missing chunks first; the rest next turn. A long
  // list in one burst would only add to the congestion that lost the results.
  std::vector<wire::ChunkRange> ranges = wire::ToRanges(missing);
  std::vector<uint8_t> p =
      std::move(wire::EncodeRanges(ranges, wire::ControlPayloadLimit(transport_->max_datagram(), options_.chunk_bytes))[0]);
  h.payload_len = static_cast<uint32_t>(p.size());
  absl::Status s = outbox_.AddOwned(flows_[dest].addr, h, std::move(p), flows_[dest].sign_key);
  if (!s.ok()) DLCP_LOG(Warning) << "result request: " << s;
  if (!done_only) {
    TraceMoment(op, "result request", MonotonicNow(),
                absl::StrCat("\"chunks\":", missing.size(), ",\"aggregator\":", Json(AggregatorOf(dest))));
  }
}

void TransferEngine::SendDone(uint32_t key, uint32_t round, uint32_t dest, uint32_t tensor_elems,
                              uint32_t chunk_count) {
  wire::Header h = BaseHeader(wire::MsgType::kResultReq, dest, key, round, tensor_elems, chunk_count);
  h.flags = wire::kFlagDone;
  std::vector<uint8_t> empty = wire::EncodeRanges({}, 16)[0];
  h.payload_len = static_cast<uint32_t>(empty.size());
  absl::Status s = outbox_.AddOwned(flows_[dest].addr, h, std::move(empty), flows_[dest].sign_key);
  if (!s.ok()) DLCP_LOG(Warning) << "done: " << s;
}

void TransferEngine::RetainInput(Op& op) {
  // Into the buffer of the round before the last, when there is one: a fresh buffer of the
  // tensor's size each op costs a page fault per page, which made remap rounds 3x as long.
  std::vector<float>& input = op.retained.input;
  if (auto spare = spare_inputs_.find(op.key); spare != spare_inputs_.end()) {
    input.swap(spare->second);
    spare_inputs_.erase(spare);
  }
  input.resize(op.geometry.tensor_elems);
  op.retained.kept = 0;
  KeepInput(op, op.gate.ready());
}

void TransferEngine::KeepInput(Op& op, uint64_t ready) {
  const uint64_t upto = std::min<uint64_t>(ready, op.geometry.tensor_elems);
  if (upto <= op.retained.kept || op.retained.input.size() != op.geometry.tensor_elems) return;
  std::memcpy(op.retained.input.data() + op.retained.kept, op.data + op.retained.kept,
              (upto - op.retained.kept) * sizeof(float));
  op.retained.kept = upto;
}

void TransferEngine::ScanTimers(absl::Time now) {
  std::vector<std::pair<uint32_t, absl::Status>> expired;
  std::vector<uint32_t> tails;
  next_tail_ = absl::InfiniteFuture();
  for (auto& [key, op_ptr] : ops_) {
    Op& op = *op_ptr;
    if (now >= op.clock.deadline) {
      std::string where;
      for (uint32_t d = 0; d < op.dests.size(); ++d) {
        uint32_t missing = 0;
        for (uint32_t c : op.plan->chunks_by_dest[d]) missing += op.chunks.state[c] != kHave;
        if (missing > 0) absl::StrAppend(&where, " ", flows_[d].addr.ToString(), ":", missing);
      }
      expired.emplace_back(key, absl::DeadlineExceededError(absl::StrCat(
                                    "AllReduce key ", key, " round ", op.round, ": ", op.remaining, " of ",
                                    op.geometry.chunk_count(), " result chunks missing after ", absl::FormatDuration(options_.op_timeout),
                                    " (missing per aggregator endpoint:", where,
                                    "); are all workers of the job running?")));
      continue;
    }
    if (absl::Status s = op.gate.get() ? op.gate.get()->abandoned() : absl::OkStatus(); !s.ok()) {
      SendDoneToAll(op);  // the aggregators may release what it pushed
      expired.emplace_back(key, std::move(s));
      continue;
    }
    // Its sum is still being made: no silence yet, and nothing stalled.
    if (!op.gate.complete()) {
      op.clock.last_progress = now;
      continue;
    }
    if (op.bounded.pull_armed && now >= PullTailEnd(op)) {
      tails.push_back(key);
      continue;
    }
    if (op.bounded.pull_armed) next_tail_ = std::min(next_tail_, PullTailEnd(op));
    ReleaseStalledWindows(op, now);
    // Quiet for the op's own pace once results flow (as at the aggregator), and never shorter
    // than a slow path's own gaps between results; before the first result there is no pace
    // yet, and the configured timeout applies.
    const uint32_t arrived = op.geometry.chunk_count() - op.remaining;
    const absl::Duration quiet =
        arrived == 0 ? options_.repair_timeout
                     : RepairQuiet(op.clock.start, op.clock.first_result, op.clock.last_progress, arrived,
                                   options_.repair_timeout);
    if (now >= op.clock.next_repair && now - op.clock.last_progress >= quiet) {
      const std::vector<uint8_t> wanted = WantedResults(op);
      for (uint32_t d = 0; d < op.dests.size(); ++d) {
        // Silence: whatever is in flight was lost or waits on someone else's loss. It no longer
        // holds the window (like a retransmission timeout): the aggregator NACKs what it needs,
        // and under bounded loss it may not need these at all, so waiting for them could stall
        // the round for good. For the window it is a loss (NoteSilence: unless round trips were
        // flat) unless the oldest push out turns up after all (CongestionWindow::OnSilence).
        Dest& dest = op.dests[d];
        if (options_.adaptive_window && (dest.next > dest.acked || dest.repairs_out > 0)) NoteSilence(op, d);
        dest.acked = dest.next;
        dest.repairs_out = 0;
        // An aggregator that has never answered may have missed the whole manifest, or the round.
        if (op.loss_bound_ppm > 0 && !op.bounded.stopped[d] && !op.bounded.heard[d]) SendManifest(op, d);
        SendResultReq(op, d, false, &wanted);
      }
      ++op.stats.result_requests;
      op.clock.repair_attempts = std::min(op.clock.repair_attempts + 1, kMaxRepairBackoff);
      op.clock.next_repair = now + quiet * op.clock.repair_attempts;
    }
  }
  for (auto& [key, status] : expired) Finish(key, std::move(status));
  for (uint32_t key : tails) CompletePartial(*ops_[key], now);
}

void TransferEngine::Finish(uint32_t key, absl::StatusOr<RoundStats> result) {
  auto it = ops_.find(key);
  if (it == ops_.end()) return;
  std::unique_ptr<Op> op = std::move(it->second);
  ops_.erase(it);
  if (op->retained.replay) return FinishReplay(std::move(op), result.status());
  TraceEnd(*op, result.status());
  {
    std::lock_guard<std::mutex> lock(mu_);
    shared_.active_keys.erase(key);
  }
  const bool keep = options_.retain_inputs && result.ok();
  op->done(std::move(result));
  if (keep) {
    // What a regroup needs to push this round again: the input, classes and shape. The caller's
    // buffer is the caller's again.
    op->data = nullptr;
    op->staging = {};  // a device op's results; its input stays in `input`
    op->done = nullptr;
    op->chunks.state = {};
    op->dests = {};
    std::unique_ptr<Op>& last = last_done_[key];
    if (last) spare_inputs_[key] = std::move(last->retained.input);  // the next op's copy reuses it
    last = std::move(op);
  }
}

void TransferEngine::TraceBegin(const Op& op, absl::Time now) {
  if (!Traced(op)) return;
  options_.timeline->Begin(TraceId(op), TraceName(op), op.clock.enqueued,
                           absl::StrCat("\"key\":", op.key, ",\"round\":", op.round, ",\"elems\":",
                                        op.geometry.tensor_elems, ",\"chunks\":", op.geometry.chunk_count(),
                                        ",\"loss_bound\":", static_cast<double>(op.loss_bound_ppm) / wire::kPpm));
  options_.timeline->Instant(TraceId(op), "packed", now);
}

void TransferEngine::TraceMoment(const Op& op, const char* what, absl::Time now, std::string args) {
  if (Traced(op)) options_.timeline->Instant(TraceId(op), what, now, std::move(args));
}

void TransferEngine::TraceEnd(const Op& op, const absl::Status& status) {
  if (!Traced(op)) return;
  std::string args = absl::StrCat("\"retransmits\":", op.stats.retransmits, ",\"result_requests\":",
                                  op.stats.result_requests, ",\"bytes_sent\":", op.stats.bytes_sent);
  if (!status.ok()) absl::StrAppend(&args, ",\"error\":", Json(status.ToString()));
  options_.timeline->End(TraceId(op), TraceName(op), MonotonicNow(), std::move(args));
}

std::array<uint64_t, static_cast<size_t>(wire::Reject::kCount)> TransferEngine::rejects() const {
  std::array<uint64_t, static_cast<size_t>(wire::Reject::kCount)> out{};
  for (size_t i = 0; i < out.size(); ++i) out[i] = rejects_[i].load(std::memory_order_relaxed);
  return out;
}

uint64_t TransferEngine::receive_overflows() const {
  return transport_->counters().rx_overflows.load(std::memory_order_relaxed);
}

uint64_t TransferEngine::receive_queue_ran_dry() const {
  return transport_->OwnCounter("rx_queue_empty");
}

}  // namespace dlcp
