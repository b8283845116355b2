// The control-plane side of a client: gRPC channels to the aggregators, Join/Leave, and a
// heartbeat thread. Every RPC uses the callback API with a deadline; callers block on a future
// for at most that deadline.
#pragma once

#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "client/waiting_notes.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics/straggler_board.h"
#include "common/rpc/heartbeat.h"
#include "common/security/tls.h"
#include "common/transport/address.h"
#include "common/wire/mac.h"
#include "client/key_progress.h"
#include "client/pending_call.h"
#include "dlcp/v1/control.grpc.pb.h"

namespace dlcp {

struct AggregatorInfo {
  std::string control;                 // host:port as given
  std::vector<Address> data_endpoints; // resolved
  std::vector<std::vector<Address>> data_sources;  // per endpoint: its other (spraying) source addresses
  uint32_t max_rounds_in_flight = 0;
  uint32_t epoch = 0;                   // of this job's incarnation at this aggregator
  uint32_t rejoins = 0;                 // times the job went on after losing a worker (JoinResponse)
  std::optional<wire::MacKey> data_key; // the job's newest data-plane key there, if it authenticates
  // Key rotation (docs/security.md): the key before data_key, still accepted while the
  // aggregator may sign with it, and data_key's generation.
  std::optional<wire::MacKey> previous_data_key;
  uint32_t data_key_generation = 0;
  // What this worker signs with there: a key of its rank alone (per-worker keys), of
  // data_key_generation; unset: data_key.
  std::optional<wire::MacKey> worker_key;
};

struct SessionOptions {
  std::vector<std::string> aggregators;
  std::string job_name;
  uint32_t world_size = 0;
  uint32_t rank = 0;
  uint32_t chunk_bytes = 0;
  std::string data_host;
  uint16_t data_port = 0;
  int data_family = AF_INET;  // our data plane's: aggregators' data endpoints are resolved in it
  uint32_t data_qpn = 0;   // RDMA: our UD queue pair (data_host is then our GID's address)
  uint32_t data_qkey = 0;  // RDMA: the Q_Key it accepts
  absl::Duration rpc_timeout = absl::Seconds(5);
  absl::Duration heartbeat_interval = kDefaultHeartbeatInterval;
  TlsOptions tls;
  uint8_t control_dscp = 46;  // gRPC sockets ride the top class (common/rpc/socket_marks.h)
  // Who this worker is, in every Join and heartbeat (JoinRequest.incarnation): Session::Join
  // draws it when 0, and resolves `aggregators` into `resolved_aggregators` when that is empty.
  uint64_t incarnation = 0;
  std::vector<std::string> resolved_aggregators;
  std::string client_host;  // this host's name, for the aggregators' errors; Session::Join fills it
  std::vector<uint32_t> host_group;  // the ranks of this worker's host stage (JoinRequest.host_group)
};

class Session {
 public:
  // Joins the job on every aggregator, in parallel; fails if any join fails.
  static absl::StatusOr<std::unique_ptr<Session>> Join(const SessionOptions& options);
  ~Session();

  uint32_t job_id() const { return job_id_; }
  // A copy: an aggregator that comes back brings new endpoints, epoch and key.
  std::vector<AggregatorInfo> aggregators() const;
  // Leaves on every aggregator at once and stops heartbeats; blocks for at most rpc_timeout after
  // the heartbeat thread has stopped. Unreachable aggregators, and those that no longer hold
  // the worker, are logged, not an error. Idempotent.
  absl::Status Leave();
  // This worker can make no more progress (`status` says why, e.g. a lost aggregator): the fatal
  // handler runs, and Leave tells the aggregators the reason, which they give the job's other
  // workers. The first call counts. Any thread.
  void Fatal(const absl::Status& status);
  // What Leave tells the aggregators, short of a Fatal: why this worker's ops failed while the
  // job stays (its host stage lost a worker), so that, should it leave over them, the others
  // learn the cause rather than only that it left. OK clears it (the job went on). Any thread.
  void SetLeaveReason(const absl::Status& why);
  // Called (on the heartbeat thread) when an aggregator says this worker is no longer a member,
  // e.g. after it was silent past the heartbeat deadline. Set before heartbeats matter.
  void set_fatal_handler(std::function<void(const absl::Status&)> handler);
  // Aggregator fail-over: called on the heartbeat thread (it must not block), instead of the
  // fatal handler, when aggregators stop answering for longer than the deadline while others
  // still do (`lost`, with the reason), when they say they are draining (`lost`, `planned`:
  // they still serve), or when a lost one answers a Join again (`back`). Lost aggregators get no
  // heartbeats, only a Join four times per heartbeat interval. For `back` and planned losses,
  // returning false means "not now": nothing changes, and they are offered again at the next
  // heartbeat (or probe). Set before heartbeats matter.
  using LayoutHandler = std::function<bool(const std::vector<size_t>& lost, const std::vector<size_t>& back,
                                           const absl::Status& why, bool planned)>;
  void set_layout_handler(LayoutHandler handler);
  // Called on the heartbeat thread once every aggregator (but lost ones) says the job went on
  // after losing a worker (its rejoin count grew): with each one's new epoch (0 for lost ones).
  using RejoinHandler = std::function<void(const std::vector<uint32_t>& epochs)>;
  void set_rejoin_handler(RejoinHandler handler);
  // Called on the heartbeat thread (it must not block) at each heartbeat answer that says the job
  // failed (HeartbeatResponse.job_failure): ABORTED naming the aggregator and its reason.
  using JobFailureHandler = std::function<void(const absl::Status& why)>;
  void set_job_failure_handler(JobFailureHandler handler);
  // Called on the heartbeat thread (it must not block) when an aggregator's heartbeat answer
  // moves its data keys on: sign with `info.data_key`, accept it and `info.previous_data_key`.
  // The next heartbeat there says this worker holds the new key, so the handler must have made
  // the data path use it by then (the transfer engine does within a turn of its loop). Setting
  // it also calls it at once, on the caller's thread, with every aggregator's keys as they are.
  // Called on the heartbeat thread before each round of heartbeats (it must not block): how late
  // each member of the host stage this worker leads comes to it (HostStage::MemberLateness),
  // which its heartbeats carry (HeartbeatRequest.stage_members); empty where it leads none.
  using StageReporter = std::function<std::vector<RankLateness>()>;
  void set_stage_reporter(StageReporter reporter);
  StageReporter stage_reporter() const;
  using KeyHandler = std::function<void(const AggregatorInfo& info)>;
  void set_key_handler(KeyHandler handler);
  std::vector<bool> lost() const;
  // What the aggregators' rounds wait for, as their heartbeat answers last said; outlives the
  // session for whoever holds it.
  std::shared_ptr<const WaitingNotes> waiting() const { return waiting_; }

  struct RegroupResult {
    std::vector<uint32_t> epochs;  // per aggregator: the job's new epoch there; 0 for the lost
    std::vector<KeyProgress> agreed;
  };
  // Any thread but the heartbeat thread; blocks for up to `wait` plus the RPC timeout. Tells
  // every surviving aggregator that the job goes on without the lost ones; the one with the
  // smallest address waits for every worker and returns the job's agreement on finished rounds.
  // `lost`: per aggregator, whether the job goes on without it.
  absl::StatusOr<RegroupResult> Regroup(uint32_t generation, const std::vector<bool>& lost,
                                        const std::vector<KeyProgress>& progress, absl::Duration wait);
  absl::Duration heartbeat_timeout() const { return heartbeat_timeout_; }

 private:
  Session() = default;
  struct Joined {
    uint32_t job_id = 0;
    absl::Duration heartbeat_timeout;
    AggregatorInfo info;
  };
  using JoinCall = PendingCall<v1::JoinRequest, v1::JoinResponse>;
  static absl::StatusOr<Joined> JoinOne(const SessionOptions& options, v1::Aggregator::Stub* stub,
                                        const std::string& control);
  // JoinOne in two halves, so that probes run alongside heartbeats: the call, then its answer.
  static std::unique_ptr<JoinCall> StartJoin(const SessionOptions& options, v1::Aggregator::Stub* stub,
                                             absl::Duration timeout);
  static absl::StatusOr<Joined> FinishJoin(const SessionOptions& options, v1::Aggregator::Stub* stub,
                                           const std::string& control, JoinCall& call);
  void HeartbeatLoop();
  // One pass of it, without the lock: beats to the aggregators not `lost` (when `beat`), probes
  // of the lost, then what their answers say.
  void HeartbeatPass(const std::vector<bool>& lost, bool beat, const LayoutHandler& on_change);
  using HeartbeatCall = PendingCall<v1::HeartbeatRequest, v1::HeartbeatResponse>;
  std::unique_ptr<HeartbeatCall> StartHeartbeat(size_t i, absl::Duration timeout,
                                                const std::vector<RankLateness>& stage_members);
  // The aggregators a heartbeat pass found gone (`lost`) or going (`draining`), and the first
  // reason of each kind.
  struct Losses {
    std::vector<size_t> lost, draining;
    absl::Status why, why_draining;
    void Add(size_t i, absl::Status s, bool planned);
  };
  void ReadHeartbeat(size_t i, HeartbeatCall& call, const LayoutHandler& on_change, Losses* losses);
  // Marks what the pass found lost and hands it to the layout handler (fail-over), or fails.
  void ApplyLosses(const std::vector<bool>& lost, const LayoutHandler& on_change, Losses losses);
  // A lost aggregator answered a probe (Join) so: takes it back if it is back in the job.
  void ProbeLost(size_t i, absl::StatusOr<Joined> joined, const LayoutHandler& on_change);
  // After a heartbeat pass: once every aggregator not lost has said the job went on, tell the
  // rejoin handler.
  void NoteRejoin(const std::vector<bool>& lost);
  // A heartbeat answer from aggregator i: takes its keys if they moved on.
  void NoteKeys(size_t i, const v1::HeartbeatResponse& resp);
  // A heartbeat answer from aggregator i said the job failed: tells the job failure handler.
  void NoteJobFailure(size_t i, const std::string& reason);

  SessionOptions options_;
  uint32_t job_id_ = 0;
  absl::Duration heartbeat_interval_;
  absl::Duration heartbeat_timeout_ = absl::InfiniteDuration();  // the aggregators' deadline
  std::vector<absl::Time> last_ok_;  // per aggregator: last successful heartbeat (heartbeat thread)
  std::function<void(const absl::Status&)> fatal_;  // under mu_
  LayoutHandler layout_handler_;  // under mu_
  RejoinHandler rejoin_handler_;  // under mu_
  StageReporter stage_reporter_;  // under mu_
  JobFailureHandler job_failure_handler_;  // under mu_
  KeyHandler key_handler_;        // under mu_
  uint32_t rejoins_ = 0;          // the count this worker works under (heartbeat thread)
  std::vector<uint32_t> rejoined_epochs_;  // per aggregator: its epoch once its count grew, else 0
  std::vector<bool> lost_;    // per aggregator, under mu_
  absl::Status fatal_status_;  // the first Fatal, under mu_: told to the aggregators at Leave
  absl::Status leave_reason_;  // SetLeaveReason's, under mu_: told at Leave when no Fatal was
  // Written by the heartbeat thread under mu_ (a returning aggregator), read elsewhere under it.
  std::vector<AggregatorInfo> aggregators_;
  std::vector<std::unique_ptr<v1::Aggregator::Stub>> stubs_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool left_ = false;
  std::thread heartbeat_;
  std::shared_ptr<WaitingNotes> waiting_ = std::make_shared<WaitingNotes>();
};

absl::Status FromGrpcStatus(const grpc::Status& s, const std::string& context);

}  // namespace dlcp
