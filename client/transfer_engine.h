// The client's data path. One I/O thread owns the transport's receive side and every op in
// flight: it pushes chunks to their aggregator endpoints under a per-endpoint window, places
// result chunks into the caller's buffer, answers NACKs and probes, and asks for missing results
// when an op goes quiet. Submit() is the only entry from other threads; completions run on the
// I/O thread (OpDone's rules in client.h).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/client.h"
#include "client/key_progress.h"
#include "client/leg_gate.h"
#include "client/dest_flow.h"
#include "client/packer/packer.h"
#include "client/timeline.h"
#include "client/transfer_op.h"
#include "common/datapath/congestion_window.h"
#include "common/datapath/outbox.h"
#include "common/datapath/pacer.h"
#include "common/datapath/nack_filter.h"
#include "common/datapath/path_steering.h"
#include "common/topology/topology.h"
#include "common/transport/transport.h"
#include "common/transport/transport_options.h"
#include "common/wire/geometry.h"
#include "common/wire/header.h"
#include "common/wire/mac.h"

namespace dlcp {

// What a loss leaves of an endpoint's (and a path's) window. Every worker's push of a chunk
// crosses the same switch port, and each takes another worker's loss there as its own
// (transfer_window.cc), so one overflow cuts many windows at once. Measured with pacing on the
// two-spine bed (jumbo frames), 0.35 instead of TCP's 0.5 made rounds 4-5% faster at p50 and 5-7%
// at p99 and pushed a third as many chunks again; 0.7 was 6% slower (docs/congestion.md).
inline constexpr double kWindowDecrease = 0.35;

// A host stage's network leg (docs/host-stage.md), as its first worker submits it: the sum of
// `carries` ranks (its pushes say so). It is the whole tensor, as a worker without a stage pushes it.
// With `gate`, the tensor is still being summed: each part goes out once the gate opens past it
// (or, where the round must read the whole tensor first, the round starts once it is all open).
struct StageLeg {
  uint16_t carries = 1;
  std::shared_ptr<LegGate> gate;
};

// Where the job's aggregators are, one entry per aggregator, in the same order in every field.
struct EngineLayout {
  std::vector<uint32_t> epochs;  // the job's epoch at each
  std::vector<std::optional<wire::MacKey>> keys;  // its data key for this job there
  // Key rotation: the key before, still accepted from there while set, and the generation of
  // `keys` (both may be shorter than keys).
  std::vector<std::optional<wire::MacKey>> previous_keys;
  std::vector<uint32_t> key_generations;
  // What this worker signs with there (per-worker keys); unset, or shorter than keys: `keys`.
  std::vector<std::optional<wire::MacKey>> worker_keys;
  // Data endpoints of each aggregator.
  std::vector<std::vector<Address>> endpoints;
  // Per aggregator and endpoint, the other addresses that endpoint's datagrams come from (path
  // spraying); may be empty.
  std::vector<std::vector<std::vector<Address>>> sources;
  std::vector<std::string> aggregator_ids;
};

struct EngineOptions : EngineLayout {
  uint32_t job = 0;
  uint32_t rank = 0;
  uint32_t chunk_bytes = 0;
  uint32_t window_chunks = 512;
  // Adapt the window per endpoint to loss (common/datapath/congestion_window.h), up to
  // window_chunks; false: window_chunks always.
  bool adaptive_window = true;
  // With adaptive_window, over a transport whose messages can choose their send path (UDP
  // spraying): pushes go out in runs of path_burst per path, each path's share following its
  // own loss (common/datapath/path_steering.h).
  bool path_steering = true;
  // In a reliable round, a NACKed push not known to be lost (common/datapath/nack_filter.h) goes
  // again only when it is asked for again, not at once.
  bool nack_filter = true;
  // With adaptive_window, a loss not known to be in class 0 cuts only while round trips to its
  // endpoint stand this far above their minimum (common/datapath/delay_signal.h); zero: every
  // loss cuts.
  absl::Duration congestion_delay = absl::Microseconds(700);
  // Spread pushes to each endpoint over time at twice the rate its results come back
  // (common/datapath/pacer.h), rather than sending each opening of the window at once.
  bool pacing = true;
  uint32_t path_burst = 8;
  uint32_t max_inflight = 64;
  uint32_t world = 1;
  double loss_bound = 0;  // job default; AllReduceOptions may override per tensor
  ClassPolicyOptions class_policy;
  wire::Encoding payload_encoding = wire::Encoding::kF32;
  uint32_t num_layers = 0;
  bool rescale = true;    // ClientOptions::Compensation::kRescale
  bool error_feedback = true;
  PhaseAwareOptions phase_aware;
  DropInjectorOptions inject;
  bool bounded_pull = false;
  double pull_loss_bound = 0;
  absl::Duration repair_timeout = absl::Milliseconds(5);
  absl::Duration op_timeout = absl::Seconds(60);
  // Where the ops' timeline goes (ClientOptions::timeline); null: nowhere.
  std::shared_ptr<Timeline> timeline;
  // Keep a copy of each op's input, and of the last finished op's per key, so that the job can
  // run rounds again after it lost an aggregator (PauseForRegroup / Resume).
  bool retain_inputs = false;
};

class TransferEngine {
 public:
  TransferEngine(const EngineOptions& options, std::unique_ptr<Transport> transport);
  ~TransferEngine();

  // Any thread. Validates and enqueues; `done` runs once, on the I/O thread (or on the caller's
  // thread if the op is refused at once). With broadcast_root >= 0 the op is a broadcast from
  // that rank: other ranks contribute zeros. `leg`: the op is a host stage's network leg, which
  // this worker leads.
  void Submit(uint32_t key, absl::Span<float> data, const AllReduceOptions& options, int64_t broadcast_root,
              OpDone done, StageLeg leg = {});
  // The same for a tensor in CUDA device memory: the CUDA packer packs it, results gather in a
  // host buffer of the op and go back to the device when the op completes.
  void SubmitDevice(uint32_t key, const DeviceTensor& tensor, const AllReduceOptions& options, OpDone done);
  // Fails every pending op with `reason` and joins the I/O thread. Idempotent.
  void Stop(const absl::Status& reason);
  // Any thread: the job can no longer make progress (e.g. this worker was dropped). Every pending
  // and later op fails with `reason`.
  void FailFatal(const absl::Status& reason);

  // Any thread: `rounds` rounds of `key` ran without this worker's engine (its host stage's first
  // worker pushed them for it). Its next op of `key` numbers its round after them, as that
  // worker's does, whichever path it takes.
  void SkipRounds(uint32_t key, uint32_t rounds);

  // Any thread: the job lost a worker (an aggregator said so). Every pending op, and every op
  // submitted until Rejoin, fails with `reason`.
  void FailJob(const absl::Status& reason);
  // Any thread: every rank is back and the job goes on, in `epochs` (per aggregator of the
  // layout). Rounds count from 0 again. Ops still pending that got no result yet start again in
  // the new epoch; any other fails (its round was abandoned), to be retried by the caller.
  // `rerun_all`: every op under way fails, to be run again: this worker's host stage formed again
  // and carries its ops from now on (StageKeeper), which the others of the stage wait for there.
  void Rejoin(std::vector<uint32_t> epochs, bool rerun_all = false);

  // Aggregator fail-over (needs retain_inputs). Any thread but the I/O thread. Stops every push
  // and repair, and drops what arrives, until Resume; returns the rounds finished per key. Blocks
  // until the I/O thread has stopped, at most `timeout`.
  absl::StatusOr<std::vector<KeyProgress>> PauseForRegroup(absl::Duration timeout);
  // Continues in `layout` (the surviving aggregators, in their new epochs): every op in flight
  // starts again from its input, and where this worker finished one more round of a key than the
  // slowest worker (`agreed`), it pushes that round again first, so the others can finish it.
  void Resume(EngineLayout layout, std::vector<KeyProgress> agreed);

  // Any thread: the aggregator `aggregator_id` (as in EngineLayout) moved its data keys on to
  // `generation` (key rotation, docs/security.md). Pushes to it are signed with `worker` (with
  // `newest` when unset) and its packets checked under `newest` or `previous` from the I/O
  // thread's next turn on, and in any later layout that has older keys for it. Ignored for an
  // aggregator not in the layout or without a key, and where the engine already has these keys
  // or newer ones.
  void UpdateKeys(const std::string& aggregator_id, uint32_t generation, const wire::MacKey& newest,
                  std::optional<wire::MacKey> previous, std::optional<wire::MacKey> worker = std::nullopt);

  // Any thread: the packets the I/O thread dropped so far, by reason (indexed by wire::Reject).
  std::array<uint64_t, static_cast<size_t>(wire::Reject::kCount)> rejects() const;
  // Any thread: datagrams the kernel dropped before the I/O thread saw them, because the
  // transport's receive buffer was full (TransportCounters::rx_overflows).
  uint64_t receive_overflows() const;
  // Any thread: how often the RDMA receive queue ran dry (Transport::OwnCounters, "rx_queue_empty").
  uint64_t receive_queue_ran_dry() const;
  // The transport's port counters (Transport::port_counters); nullptr where it has no port of its
  // own. Reading them reads files; any thread.
  const PortCounterSource* port_counters() const { return transport_->port_counters(); }
  TransportOptions::Kind transport_kind() const { return transport_->kind(); }

 private:
  struct KeyUpdate {
    std::string aggregator_id;
    uint32_t version;  // KeyVersion (transfer_keys.cc)
    wire::MacKey newest;
    std::optional<wire::MacKey> previous;
    std::optional<wire::MacKey> worker;
  };
  void ServeKeys();  // I/O thread: takes shared_.key_updates into latest_keys_ and applies them
  void ApplyLatestKeys();  // I/O thread: latest_keys_ over the layout's where newer
  // What pushes to aggregator `a` are signed with: this worker's own key there, else the job's;
  // nullptr where it does not authenticate.
  const wire::MacKey* SignKey(size_t a) const;
  using Plan = ChunkPlan;
  using Dest = DestProgress;
  using Op = TransferOp;

  void Run();
  // Validates and enqueues an op whose `data` is set (Submit, SubmitDevice).
  void Enqueue(std::unique_ptr<Op> op, uint32_t key, uint64_t elems, const AllReduceOptions& options);
  void TakeSubmissions(absl::Time now);
  // (Re)starts an op already prepared: plan, per-chunk state, windows, timers, manifests.
  void Launch(Op& op, absl::Time now);
  // retain_inputs: keeps a copy of the op's input for a regroup to push again (KeepInput: of a
  // gated op, what is summed so far, its first `ready` elements).
  void RetainInput(Op& op);
  void KeepInput(Op& op, uint64_t ready);
  // Derives destinations, topology and plans from options_'s layout.
  void BuildDestinations();
  // The I/O thread's side of PauseForRegroup and Resume (transfer_regroup.cc).
  void ServeRegroup(absl::Time now);
  void ServeRejoin(absl::Time now);
  // Under mu_, at a rejoin: ops that nothing of arrived start as round 0 of the new epoch (others
  // go into `abandoned`, to fail), and so do those submitted but not yet taken.
  void RelaunchUnstarted(absl::Time now, std::vector<uint32_t>* abandoned);
  // Under mu_: every op under way, out of the engine, its key free again.
  void TakeEveryOp(std::vector<std::unique_ptr<Op>>* started, std::deque<std::unique_ptr<Op>>* unstarted);
  // Outside mu_: fails ops TakeEveryOp took, with `reason` (their OpDone may submit again).
  void FailTaken(std::vector<std::unique_ptr<Op>>& started, std::deque<std::unique_ptr<Op>>& unstarted,
                 const absl::Status& reason);
  void Restart(Op& op, absl::Time now);
  std::unique_ptr<Op> ReplayOf(const Op& finished);
  // A replay ended: the op it held back for its key starts.
  void FinishReplay(std::unique_ptr<Op> replay, const absl::Status& status);
  // Pushes up to `budget` chunks and repairs over every op, under each dest's window and pacer;
  // returns whether more could go at once.
  bool PushSome(size_t budget);
  void StartTurn(size_t budget);  // counts what is in flight per dest
  // One op's repairs, then new pushes, to one dest; of a gated op, only its first `ready` elements.
  bool PushTo(Op& op, uint32_t dest, uint64_t ready);
  bool RepairRoom(uint32_t dest, size_t window) const;
  void Spend(uint32_t dest);  // a push or repair to `dest` takes a pacer token
  void PushChunk(Op& op, uint32_t dest, wire::Header& h, uint32_t chunk, bool repair);
  void PushByClass(Op& op, uint32_t dest, wire::Header& h);
  void HandleDatagram(const InMessage& m, absl::Time now);
  void HandleResult(Op& op, const wire::Header& h, const InMessage& m, absl::Time now);
  void HandleNack(Op& op, const wire::Header& h, const uint8_t* payload, uint32_t from_dest);
  void HandleStop(Op& op, const wire::Header& h, const uint8_t* payload, uint32_t from_dest, absl::Time now);
  void SendManifest(const Op& op, uint32_t dest);
  // A gated op (StageLeg::gate) can go out part by part: nothing reads its whole tensor before
  // it is pushed (float32 sent straight from it in one class, no residual, no broadcast, no copy
  // kept for a regroup). Otherwise it starts once its gate is all open.
  bool PushesPartly(const Op& op);
  // Whether chunk `c` of `op` is summed (its gate opened past it); `ready` from op.gate.ready().
  static bool ChunkReady(const Op& op, uint32_t c, uint64_t ready) {
    return op.geometry.offset(c) + op.geometry.elems(c) <= ready;
  }
  // Classifies the op's chunks and writes its packets (client/packer), with error feedback.
  absl::Status Prepare(Op& op);
  absl::Status PackDevice(Op& op);
  absl::Status PackHost(Op& op);
  PackInput PackInputOf(const Op& op, const void* data) const;
  // Adds what earlier rounds left out of this worker's contribution into the op's data.
  void ApplyResidual(Op& op);
  // Completes the op when every result is in, or arms the bounded pull's tail when enough are.
  void MaybeComplete(Op& op, absl::Time now);
  void Complete(Op& op, absl::Time now);
  // DONE for the op's round to each of its aggregators: they may release it.
  void SendDoneToAll(const Op& op);
  // Bounded pull: zeroes the results that never came, then completes.
  void CompletePartial(Op& op, absl::Time now);
  // When an armed op's tail ends: a quiet spell after its latest result, as at the aggregator.
  absl::Time PullTailEnd(const Op& op) const;
  // Bounded pull after the seal: the results worth asking for again (every class-0 one, and as
  // many others as the bound needs, most important first); empty: ask for everything missing.
  std::vector<uint8_t> WantedResults(const Op& op) const;
  void SendResultReq(const Op& op, uint32_t dest, bool done_only, const std::vector<uint8_t>* wanted = nullptr);
  void SendDone(uint32_t key, uint32_t round, uint32_t dest, uint32_t tensor_elems, uint32_t chunk_count);
  void ScanTimers(absl::Time now);
  // A full window whose results have stopped coming (for a few of the op's own result gaps) holds
  // pushes that were lost or that wait on someone else's loss, which under bounded loss the
  // aggregator may never repair. Treat them as gone, like a retransmission timeout, so the rest
  // of the tensor can follow; the aggregator NACKs what it needs.
  void ReleaseStalledWindows(Op& op, absl::Time now);
  // A result came back for dest position `pos`: the window grows, and chunks pushed well before
  // it that still lack a result count as lost (like TCP's duplicate acknowledgements).
  void OnResultPosition(Op& op, uint32_t dest, size_t pos, bool lost);
  void NoteLoss(Op& op, uint32_t chunk);
  void NoteClassZeroLoss(Op& op, uint32_t chunk);
  void NoteSilence(Op& op, uint32_t dest);
  uint32_t WindowOf(uint32_t dest) const;
  // The control address (as configured) of the aggregator that endpoint `dest` belongs to.
  const std::string& AggregatorOf(uint32_t dest) const;
  // Path steering: the send path for the next push to `dest`, or -1 (the transport's rotation).
  int16_t PickPath(uint32_t dest);
  // Whether the flows steer their pushes over paths (all do, or none).
  bool Steering() const { return !flows_.empty() && flows_[0].paths.has_value(); }
  void BuildPaths();
  void BuildNackFilters();
  void Finish(uint32_t key, absl::StatusOr<RoundStats> result);
  std::shared_ptr<const Plan> PlanFor(uint32_t key, uint32_t tensor_elems);
  wire::Header BaseHeader(wire::MsgType type, uint32_t dest, uint32_t key, uint32_t round, uint32_t elems,
                          uint32_t chunks) const;
  void FailAll(const absl::Status& reason);
  // The timeline (EngineOptions::timeline), where there is one: an op's span and its moments.
  // A regroup's replay of a finished round (RetainedInput::replay) has none: its round's span
  // ended with the op that finished it.
  bool Traced(const Op& op) const { return options_.timeline && !op.retained.replay; }
  void TraceBegin(const Op& op, absl::Time now);
  void TraceMoment(const Op& op, const char* what, absl::Time now, std::string args = "");
  void TraceEnd(const Op& op, const absl::Status& status);

  EngineOptions options_;
  std::unique_ptr<Transport> transport_;
  std::vector<DestFlow> flows_;  // per dest: one per endpoint of the layout
  std::unordered_map<std::string, KeyUpdate> latest_keys_;  // I/O thread: newest heard, by aggregator id
  // Where each chunk goes in the current layout, and where each packet came from.
  struct Routing {
    Topology topology;
    absl::flat_hash_map<Address, uint32_t> dest_by_addr;  // an endpoint or a source port of one -> dest
    std::vector<uint32_t> dest_base;  // first dest index of each aggregator
    std::unordered_map<uint32_t, std::shared_ptr<const Plan>> plans;  // per key, for its length
  };
  Routing routing_;
  // When a dest held back by its pacer may send again (PushSome); InfiniteFuture: none is.
  absl::Time next_pace_ = absl::InfiniteFuture();
  // PushSome's state for one turn of the loop, per dest; kept to save allocations per turn.
  struct PushTurn {
    size_t budget = 0;  // pushes left this turn
    absl::Time now;
    std::vector<size_t> inflight;  // pushes and repairs out, over every op
    std::vector<size_t> repairs;   // the repairs among them
    std::vector<uint32_t> allow;   // what the dest's pacer lets out this turn
    std::vector<uint32_t> firsts;  // chunks going out for the first time to the dest at hand
  };
  PushTurn turn_;
  Outbox outbox_;

  // What other threads hand the I/O thread, and its answers: all under mu_.
  std::mutex mu_;
  std::condition_variable regroup_cv_;  // the regroup handshake (transfer_regroup.cc)
  struct Shared {
    std::deque<std::unique_ptr<Op>> submitted;
    std::set<uint32_t> active_keys;
    std::unordered_map<uint32_t, uint32_t> next_round;
    absl::Status error;
    bool stopped = false;
    std::vector<KeyUpdate> key_updates;
    bool pause_requested = false;
    // The I/O thread's answer. Only it writes this (under mu_), so it reads it without the lock.
    bool paused = false;
    std::vector<KeyProgress> progress;
    std::optional<std::pair<EngineLayout, std::vector<KeyProgress>>> resume;
    absl::Status job_failed;  // FailJob, until Rejoin
    std::optional<std::vector<uint32_t>> rejoin;
    bool rerun_all = false;  // with `rejoin`
  };
  Shared shared_;

  // I/O thread only.
  std::unordered_map<uint32_t, std::unique_ptr<Op>> ops_;
  std::unordered_map<uint32_t, uint32_t> completed_round_;  // key -> last round finished here
  // Classes every op's chunks and, for 16-bit encodings, writes their packets (client/packer).
  std::unique_ptr<Packer> packer_;
  std::unordered_map<int, std::unique_ptr<Packer>> device_packers_;  // per CUDA device, made on first use
  DropInjector injector_;
  PhaseAwareBound phase_;
  // Error feedback, per key: this worker's contributions left out of earlier rounds, added into
  // the next one. `chunks` lists the chunks that hold something.
  struct Residual {
    std::vector<float> values;
    std::vector<uint32_t> chunks;
  };
  std::unordered_map<uint32_t, Residual> residuals_;
  Residual& ResidualOf(const Op& op) { return residuals_[op.key]; }
  // retain_inputs: the last op finished per key (its input kept), and ops waiting for their
  // key's replay to finish.
  std::unordered_map<uint32_t, std::unique_ptr<Op>> last_done_;
  // Per key, the input buffer of the round before last_done_'s, for the next op to copy into.
  std::unordered_map<uint32_t, std::vector<float>> spare_inputs_;
  std::unordered_map<uint32_t, std::unique_ptr<Op>> held_;
  // The earliest bounded-pull tail end among the ops.
  absl::Time next_tail_ = absl::InfiniteFuture();
  std::atomic<bool> stop_{false};
  std::thread io_;
  void Reject(wire::Reject why) { rejects_[static_cast<size_t>(why)].fetch_add(1, std::memory_order_relaxed); }
  std::array<std::atomic<uint64_t>, static_cast<size_t>(wire::Reject::kCount)> rejects_{};
  bool warned_source_ = false;
};

}  // namespace dlcp
