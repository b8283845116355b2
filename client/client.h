// dlcp::Client: the library a trainer links. Connect joins a job on every aggregator; AllReduce
// sums a float32 tensor across the job's workers and writes the sum back in place.
//
// Threading: every method may be called from any thread. AllReduce never blocks on the network:
// it validates, enqueues and returns a future, which the client's I/O thread completes. Each
// future completes by the op deadline at the latest. Nothing here aborts the host process; every
// failure is an absl::Status.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/packer/packer.h"
#include "common/classes/class_policy.h"
#include "common/faults/drop_injector.h"
#include "common/classes/phase_aware.h"
#include "common/rpc/heartbeat.h"
#include "common/security/tls.h"
#include "common/transport/transport.h"
#include "common/transport/transport_options.h"
#include "common/wire/payload_encoding.h"

namespace dlcp {

struct ClientOptions {
  // Control addresses (host:port) of the job's aggregators. Every worker must list the same set.
  std::vector<std::string> aggregators;
  std::string job_name;  // empty: from the launcher (ResolveJobName), else an error
  uint32_t world_size = 1;
  uint32_t rank = 0;
  // Payload bytes per chunk (one datagram). 0: the largest that fits the transport's datagram
  // with header and MAC, at most kDefaultChunkBytes (RDMA: the port's MTU less 56 bytes). Over
  // UDP, 8192 fits a 9000-byte jumbo frame; use about 1400 on a 1500-byte MTU. All workers of a
  // job must agree.
  static constexpr uint32_t kDefaultChunkBytes = 8192;
  uint32_t chunk_bytes = 0;
  TransportOptions transport;
  // gRPC security. TLS with the system's roots unless configured; plaintext must be chosen.
  TlsOptions tls;
  // The address aggregators send results to; empty means the address they see us calling from.
  std::string data_host;
  absl::Duration rpc_timeout = absl::Seconds(5);
  absl::Duration op_timeout = absl::Seconds(60);
  // The longest silence on an op before the client asks for what is missing. Once results flow,
  // it asks sooner: after 16 of the op's own mean result gaps, at least 1 ms (quiet_spell.h). A
  // fixed 20 ms was the tail of congested rounds (docs/measurements/bounded-loss.md).
  absl::Duration repair_timeout = absl::Milliseconds(5);
  absl::Duration heartbeat_interval = kDefaultHeartbeatInterval;
  // Where to write a timeline of this worker's ops, a Chrome trace-event file that Perfetto loads
  // (docs/operations.md, "Timeline"); empty: none. %r in it stands for the rank, %p for the
  // process id. Written as the ops run, completed by Close().
  std::string timeline;
  // Bytes pushed to one aggregator endpoint whose results have not come back yet (flow control).
  // Bounded so one worker's burst fits the aggregator's socket buffer.
  uint64_t window_bytes = 4 << 20;
  // Congestion control: the window per endpoint starts small, grows while results come back and
  // shrinks on loss (AIMD, docs/congestion.md), never above window_bytes. false: window_bytes
  // always, which suits only a network with room for every worker's full window at once.
  bool adaptive_window = true;
  // With the adaptive window and UDP spraying: each source port (path) gets a share of the
  // window that follows its own loss, so a lossy or slow path carries less
  // (docs/path-spraying.md). false: the ports take equal turns.
  bool path_steering = true;
  // In a reliable round, a NACKed push that may still be waiting in a switch queue goes again
  // only when the aggregator asks again (common/datapath/nack_filter.h). false: every NACK is
  // answered at once.
  bool nack_filter = true;
  // With the adaptive window: a lost push cuts it only while round trips to that endpoint stand
  // this far above their recent minimum (or by their minimum itself, if that is longer), that
  // is while a queue is filling (common/datapath/delay_signal.h, docs/congestion.md). A loss with
  // round trips where they were is random loss (a flaky link, a lossy WAN), which backing off
  // does not cure. A loss in class 0 always cuts. 0: every loss cuts.
  uint32_t congestion_delay_us = 700;
  // Pushes to each aggregator endpoint leave spread over time, at twice the rate its
  // results come back, rather than as the window opens (common/datapath/pacer.h). false: at once.
  bool pacing = true;

  // Bounded loss (docs/bounded-loss.md). ε: the largest fraction of droppable (worker, chunk)
  // contributions an aggregate may lack; class 0 is never lost. 0 (the default) makes every
  // chunk must-deliver: a job is exact unless it asks for bounded loss, here or per tensor.
  // Every worker of a job should use the same value; the strictest one wins.
  double loss_bound = 0;
  // Which chunks are class 0 (must deliver) and which droppable class 1..3 each rides in.
  ClassPolicyOptions class_policy;
  // Depth of the model, for the layer position AllReduceOptions::layer gives; 0: unknown.
  uint32_t num_layers = 0;
  // What a chunk that lacks contributions holds. kRescale: the sum scaled by
  // world / contributors, i.e. world times the average over the actual contributors.
  // kZeroFill: the plain sum, missing contributions counted as zero.
  enum class Compensation { kRescale, kZeroFill };
  Compensation compensation = Compensation::kRescale;
  // Contributions of this worker left out of a round are added into its next round of the key.
  bool error_feedback = true;
  // Optional: ε rises outside critical phases, detected from each tensor's gradient norm
  // (common/classes/phase_aware.h). RoundStats::loss_bound says what each round ran under.
  PhaseAwareOptions phase_aware;
  // How results come back. kConsistent: every worker receives the complete aggregate, so
  // replicas never diverge. kBounded (bounded-loss rounds only): once the round is sealed, a
  // worker stops waiting for results after its tail wait if every chunk it classed 0 has arrived
  // and at most ε_pull of the others are missing; those slices are zeroed (that part of the
  // update is left out) and counted in RoundStats::pull_missing. Replicas then drift apart a
  // little; Client::Broadcast brings them back together.
  enum class PullMode { kConsistent, kBounded };
  PullMode pull_mode = PullMode::kConsistent;
  double pull_loss_bound = -1;  // ε_pull; negative: loss_bound
  // Loss injected into this worker's outgoing packets, for tests and benchmarks.
  DropInjectorOptions inject;
  // When an aggregator stops answering for longer than its heartbeat deadline, or drains
  // (SIGTERM, a rollout). kRemap (the default): the workers move its share of every tensor to the
  // surviving aggregators and run the unfinished rounds again there, and move back when it serves
  // again (docs/failure-modes.md); with more than one aggregator each op keeps a copy of its
  // input for that, so memory for tensors in flight doubles. kFail: every op fails with
  // UNAVAILABLE naming it. Every worker of a job must choose the same.
  enum class AggregatorLoss { kFail, kRemap };
  AggregatorLoss on_aggregator_loss = AggregatorLoss::kRemap;
  // How values travel (docs/wire-format.md): float32, or float16 / bfloat16, which halve the
  // bytes both ways. The aggregator sums in float32 and rounds each result once. Every worker
  // must use the same encoding for a key; AllReduceOptions may choose per tensor. Broadcasts are
  // always float32, since they must be exact.
  wire::Encoding payload_encoding = wire::Encoding::kF32;

  // Host stage (docs/host-stage.md): the job's workers on one host sum in shared memory, handed
  // out by the host's dlcpd at host_socket, and the first of them pushes the host's sum. Every op
  // goes through it, on host memory or CUDA tensors, under a loss bound or not. Where there is no
  // stage (local_size under 2, no dlcpd at host_socket, a refusal), every op takes the network
  // path and the worker logs why, once.
  bool host_stage = true;
  std::string host_socket = "/run/dlcp/dlcpd.sock";
  // The job's workers on this host, this one included; 0: LOCAL_WORLD_SIZE, else 1. Every worker
  // of a host must give the same.
  uint32_t local_size = 0;
};

// "consistent" | "bounded" and "rescale" | "zero-fill", for flags and bindings.
absl::StatusOr<ClientOptions::PullMode> ParsePullMode(const std::string& name);
absl::StatusOr<ClientOptions::Compensation> ParseCompensation(const std::string& name);
// "fail" | "remap".
absl::StatusOr<ClientOptions::AggregatorLoss> ParseAggregatorLoss(const std::string& name);

struct AllReduceOptions {
  uint32_t layer = 0;        // position from the input; see ClientOptions::num_layers
  double loss_bound = -1;    // ε for this tensor; negative: ClientOptions::loss_bound
  std::optional<wire::Encoding> payload_encoding;  // unset: ClientOptions::payload_encoding
  bool report_classes = false;  // fill RoundStats::classes (a byte per chunk)
  // What the op is called on the timeline (ClientOptions::timeline), e.g. its fusion group;
  // empty: "key K".
  std::string name;
};

// A tensor in CUDA device memory, for Client::AllReduceDevice.
struct DeviceTensor {
  void* data = nullptr;
  ElemType type = ElemType::kF32;  // float32, float16 or bfloat16
  uint64_t elems = 0;
  int device = 0;  // the CUDA device it lives on
};
// OK when `tensor` can be summed here: this process has a CUDA device, and the tensor is not
// empty and of a known type. Otherwise says why.
absl::Status DeviceTensorStatus(const DeviceTensor& tensor);

struct RoundStats {
  uint32_t key = 0;
  uint32_t round = 0;
  absl::Duration time;
  uint64_t chunks = 0;
  uint64_t retransmits = 0;      // chunks pushed again after a NACK
  uint64_t nacks_deferred = 0;   // chunks NACKed while their push may still have been on its way
  uint64_t result_requests = 0;  // times this worker asked for missing results
  uint64_t window_cuts = 0;      // congestion events that halved an endpoint's window
  uint64_t window_undos = 0;     // ... found to have been late results, not losses, and undone
  // Losses read as random, not congestion (round trips had not risen), which cut no window.
  uint64_t losses_tolerated = 0;
  uint32_t min_contributors = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;

  // Bounded loss.
  double loss_bound = 0;  // ε this round ran under (through a host stage: its first worker's round's)
  std::array<uint64_t, 4> chunks_by_class = {};   // this worker's chunks, by the class it gave them
  std::array<uint64_t, 4> left_out_by_class = {}; // ... and those left out of the aggregate
  // Over every shard's STOP: droppable contributions of all workers declared, and missing.
  uint64_t droppable_total = 0;
  uint64_t droppable_missing = 0;
  uint32_t bound_violations = 0;  // shards that reported more missing than ε allows (never expected)
  absl::Duration time_to_stop;    // until the last STOP arrived
  // The longest any shard waited from its loss bound being met to its seal (STOP): the time
  // spent on stragglers the round could have done without. Zero from aggregators that predate it.
  absl::Duration tail_wait;
  uint64_t injected_drops = 0;    // packets ClientOptions::inject discarded
  uint64_t pull_missing = 0;      // kBounded pull: result chunks not received, zeroed
  // The job's slowest rank, as the aggregators last said (heartbeat answers, so up to a second
  // or two old): the rank whose part of a round reaches them latest, and its mean lateness
  // behind the first rank's over their last 128 rounds. -1 before they have named one.
  int32_t slowest_rank = -1;
  absl::Duration slowest_lateness;
  // With AllReduceOptions::report_classes: the class this worker gave each chunk, in chunk order
  // (chunks of ClientOptions::chunk_bytes), as its pushes carried them.
  std::vector<uint8_t> classes;
};

// Where a worker's ops go (docs/host-stage.md): through a host stage with the job's other workers
// on its host, or over the network path on its own.
struct HostStageInfo {
  bool formed = false;           // its ops go through a host stage now
  std::vector<uint32_t> ranks;   // the stage's ranks, ascending (this one's alone without a stage)
  uint32_t local_rank = 0;       // this worker's place among them
  uint32_t local_size = 1;       // how many they are; without a stage, ClientOptions::local_size
  bool pushes = false;           // this worker pushes the stage's sum to the aggregators
  bool whole_job = false;        // the stage holds every rank of the job: nothing crosses the network
  // Without a stage: why (host_stage off, local_size 1, no dlcpd at host_socket, a refusal by
  // dlcpd, a member of its stage gone). Empty where one formed.
  std::string why_not;
};

// Completion of an op. Runs exactly once: on the client's I/O thread (the host stage's thread for
// an op through it), or on the calling thread when the op is refused at submission. It must not block (hand the result to another thread
// for slow work); it may submit the next op, also for the same key.
using OpDone = std::function<void(absl::StatusOr<RoundStats>)>;

class TransferEngine;
class Timeline;
class Session;
class HostStage;
class StageKeeper;

class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();
  // The payload bytes per chunk this client uses (ClientOptions::chunk_bytes, resolved if 0).
  uint32_t chunk_bytes() const { return options_.chunk_bytes; }
  // The job's name (ClientOptions::job_name): what every worker of the job joined with.
  const std::string& job_name() const { return options_.job_name; }
  // How long an op may take (ClientOptions::op_timeout).
  absl::Duration op_timeout() const { return options_.op_timeout; }
  // Whether this worker's ops go through a host stage now, with whom, and if not, why. A stage
  // that lost a member reads as not formed until it forms again. Any thread.
  HostStageInfo host_stage() const;
  // The data plane it chose (kUdp or kRdma when ClientOptions asked for kAuto).
  TransportOptions::Kind transport_kind() const { return transport_kind_; }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Sums `data` over all workers of the job, in place. `key` names the tensor; every worker
  // passes the same length for a key. One op per key at a time; `data` must stay valid and
  // untouched until the future is ready.
  std::future<absl::StatusOr<RoundStats>> AllReduce(uint32_t key, absl::Span<float> data,
                                                    const AllReduceOptions& options = {});

  // The same, completing through `done` instead of a future (for bindings and schedulers that
  // must not park a thread per op).
  void AllReduceAsync(uint32_t key, absl::Span<float> data, const AllReduceOptions& options, OpDone done);

  // Sums a tensor in CUDA device memory, in place, like AllReduce. The CUDA packer reads it once
  // and writes the packets to the host (no scan of a host copy); the aggregate is written back to
  // the device in the tensor's type. The caller makes sure that whatever produced the tensor has
  // finished (e.g. synchronizes its stream) and leaves it untouched until the future is ready.
  // FAILED_PRECONDITION where no CUDA device is usable (CudaPackerAvailable says why).
  std::future<absl::StatusOr<RoundStats>> AllReduceDevice(uint32_t key, const DeviceTensor& tensor,
                                                          const AllReduceOptions& options = {});
  void AllReduceDeviceAsync(uint32_t key, const DeviceTensor& tensor, const AllReduceOptions& options, OpDone done);

  // Replaces `data` on every worker with root's `data` (exactly; reliable whatever ε is), e.g. to
  // resynchronise replicas every K rounds under the bounded pull mode. Uses `key` like AllReduce
  // does; error feedback is not applied to it.
  std::future<absl::StatusOr<RoundStats>> Broadcast(uint32_t key, absl::Span<float> data, uint32_t root);
  void BroadcastAsync(uint32_t key, absl::Span<float> data, uint32_t root, OpDone done);

  // Leaves the job on every aggregator and fails ops still pending. Idempotent. Blocks for at
  // most rpc_timeout (plus a heartbeat call's), however many aggregators do not answer. An
  // aggregator that is unreachable or no longer holds the job (it went away after the last
  // round) is logged, not an error: it forgets the worker at its heartbeat deadline anyway.
  absl::Status Close();

  uint32_t rank() const;
  uint32_t world_size() const;
  uint32_t job_id() const;
  // Data packets this client dropped since it connected, by reason (wire::RejectName: bad_mac,
  // unknown_source, stale_epoch, ...), listing only reasons that occurred. Late copies of results
  // a round no longer needs count as unknown_round. Any thread, also after Close; never blocks on
  // the data path.
  std::map<std::string, uint64_t> Rejects() const;
  // Result datagrams the kernel dropped since the client connected because its receive buffer
  // (TransportOptions::socket_buffer_bytes, capped by net.core.rmem_max) was full: loss on this
  // host, not on the network, which repairs then make good. Not among Rejects(), which counts
  // what the client itself dropped. The kernel reports drops with the next datagram it delivers,
  // so the count trails by those since the last one. UDP only (0 over RDMA, where the NIC counts
  // no such drop: see ReceiveQueueRanDry). Any thread, also after Close.
  uint64_t ReceiveOverflows() const;
  // Over RDMA, how often since the client connected its receive queue ran out of posted buffers
  // (the shared receive queue's limit event, docs/rdma.md): the NIC then drops what arrives,
  // counted only in its port's sysfs hw_counters (mlx5: out_of_buffer). A count of episodes, not
  // of datagrams lost; loss on this host, which repairs make good (raise
  // TransportOptions::rdma.recv_slots; dlcp-bench --rdma-recv-slots, Python rdma_recv_slots). 0
  // over UDP. Any thread, also after Close.
  uint64_t ReceiveQueueRanDry() const;
  // Over RDMA, the counters of the NIC port this client's data plane runs on, by name, as its
  // driver exports them in sysfs (common/transport/port_counter_source.h): what no verbs call
  // counts, above all the datagrams the NIC dropped for want of a posted receive buffer (mlx5:
  // out_of_buffer; docs/rdma.md, "The port's own counters"). They are the port's since it came
  // up, every process on it included: take differences. Empty over UDP, which has no port of its
  // own; NOT_FOUND for a port whose driver exports none. Reads files, so call it from a
  // monitoring thread, not from an OpDone. Any thread, also after Close.
  absl::StatusOr<std::map<std::string, uint64_t>> PortCounters() const;
  // One of them, read alone. NOT_FOUND for a counter the port lacks, and over UDP.
  absl::StatusOr<uint64_t> PortCounter(const std::string& name) const;

 private:
  // Hands the session's news (a fatal error, new keys, a rejoin, and with `regroup` a changed
  // layout) to the engine.
  void ListenToSession(bool regroup);
  // `done`, with a DEADLINE_EXCEEDED of `key` naming the ranks the aggregators still wait for,
  // and a success naming the job's slowest rank (RoundStats::slowest_rank).
  OpDone WithHeartbeatNews(uint32_t key, OpDone done) const;
  Client() = default;
  // On the session's heartbeat thread: starts a regroup on its own thread (Session::LayoutHandler).
  bool OnLayoutChange(const std::vector<size_t>& lost, const std::vector<size_t>& back, const absl::Status& why,
                      bool planned);
  // Pause the data path, regroup with the survivors, resume in the new layout (or fail).
  void Regroup(uint32_t generation, std::vector<bool> lost, absl::Status why);
  // The host stage an op goes through, and its options there (its ε resolved) in `staged`; null
  // where it takes the network path.
  std::shared_ptr<HostStage> ThroughHostStage(const AllReduceOptions& options, AllReduceOptions* staged) const;

  ClientOptions options_;
  TransportOptions::Kind transport_kind_ = TransportOptions::Kind::kUdp;
  std::unique_ptr<Session> session_;
  std::unique_ptr<TransferEngine> engine_;
  // Null: every op takes the network path. Its stage is lost while a worker of it is gone.
  std::unique_ptr<StageKeeper> stage_;
  void LoseStage(const absl::Status& why);
  mutable std::mutex stage_mu_;
  std::string stage_why_not_;  // under stage_mu_: why there is no stage, or why it was lost last
  std::shared_ptr<Timeline> timeline_;  // the engine's too; closed with the client
  std::mutex regroup_mu_;
  std::thread regroup_;
  bool regrouping_ = false;  // under regroup_mu_
  bool closing_ = false;     // under regroup_mu_
  uint32_t generation_ = 0;  // under regroup_mu_
};

}  // namespace dlcp
