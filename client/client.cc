#include "client/client.h"

#include <algorithm>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/host/host_stage.h"
#include "client/host/stage_join.h"
#include "client/host/stage_keeper.h"
#include "client/options/client_option_table.h"
#include "client/session.h"
#include "client/transfer_engine.h"
#include "common/base/clock.h"
#include "common/base/log.h"
#include "common/shm/stage_layout.h"
#include "common/wire/header.h"
#include "common/transport/factory.h"

namespace dlcp {
namespace {
absl::Status ValidateOptions(const ClientOptions& o) {
  if (o.aggregators.empty()) return absl::InvalidArgumentError("ClientOptions.aggregators is empty");
  if (o.world_size == 0 || o.world_size > 65535) return absl::InvalidArgumentError("world_size must be 1..65535");
  if (o.rank >= o.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", o.rank, " is not below world_size ", o.world_size));
  }
  if (o.chunk_bytes != 0 && (o.chunk_bytes < 64 || o.chunk_bytes % 4 != 0 || o.chunk_bytes > wire::kMaxPayload)) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes ", o.chunk_bytes, " must be 0 (fit the transport) or a multiple of 4 in [64, ",
                     wire::kMaxPayload, "]"));
  }
  if (o.window_bytes < std::max<uint64_t>(o.chunk_bytes, 64)) {
    return absl::InvalidArgumentError("window_bytes must hold at least one chunk");
  }
  if (!(o.loss_bound >= 0 && o.loss_bound <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("loss_bound ", o.loss_bound, " is not in [0, 1]"));
  }
  if (absl::Status s = ValidateClassPolicy(o.class_policy); !s.ok()) return s;
  if (o.phase_aware.enabled && !(o.phase_aware.relax >= 1 && o.phase_aware.threshold > 0)) {
    return absl::InvalidArgumentError("phase_aware: relax must be at least 1 and threshold positive");
  }
  if (static_cast<uint8_t>(o.payload_encoding) >= wire::kNumEncodings) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload_encoding ", static_cast<int>(o.payload_encoding), " is not f32, f16 or bf16"));
  }
  if (o.pull_loss_bound > 1) {
    return absl::InvalidArgumentError(absl::StrCat("pull_loss_bound ", o.pull_loss_bound, " is over 1"));
  }
  for (double r : o.inject.rate) {
    if (!(r >= 0 && r <= 1)) return absl::InvalidArgumentError(absl::StrCat("inject rate ", r, " is not in [0, 1]"));
  }
  if (o.op_timeout <= absl::ZeroDuration() || o.rpc_timeout <= absl::ZeroDuration() ||
      o.repair_timeout <= absl::ZeroDuration() || o.heartbeat_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("every timeout and interval must be positive");
  }
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<ClientOptions::PullMode> ParsePullMode(const std::string& name) {
  if (name == "consistent") return ClientOptions::PullMode::kConsistent;
  if (name == "bounded") return ClientOptions::PullMode::kBounded;
  return absl::InvalidArgumentError(absl::StrCat("pull mode '", name, "' is not 'consistent' or 'bounded'"));
}

absl::StatusOr<ClientOptions::Compensation> ParseCompensation(const std::string& name) {
  if (name == "rescale") return ClientOptions::Compensation::kRescale;
  if (name == "zero-fill") return ClientOptions::Compensation::kZeroFill;
  return absl::InvalidArgumentError(absl::StrCat("compensation '", name, "' is not 'rescale' or 'zero-fill'"));
}

absl::StatusOr<ClientOptions::AggregatorLoss> ParseAggregatorLoss(const std::string& name) {
  if (name == "fail") return ClientOptions::AggregatorLoss::kFail;
  if (name == "remap") return ClientOptions::AggregatorLoss::kRemap;
  return absl::InvalidArgumentError(absl::StrCat("on_aggregator_loss '", name, "' is not 'fail' or 'remap'"));
}

// The engine's view of `aggregators`, in their order: each in `epochs[i]`, skipping those at 0
// (lost); with no epochs given, every one in the epoch it joined in.
static EngineLayout LayoutOf(const std::vector<AggregatorInfo>& aggregators, const std::vector<uint32_t>& epochs) {
  EngineLayout layout;
  for (size_t i = 0; i < aggregators.size(); ++i) {
    const uint32_t epoch = epochs.empty() ? aggregators[i].epoch : epochs[i];
    if (epoch == 0) continue;
    layout.epochs.push_back(epoch);
    layout.keys.push_back(aggregators[i].data_key);
    layout.previous_keys.push_back(aggregators[i].previous_data_key);
    layout.key_generations.push_back(aggregators[i].data_key_generation);
    layout.worker_keys.push_back(aggregators[i].worker_key);
    layout.endpoints.push_back(aggregators[i].data_endpoints);
    layout.sources.push_back(aggregators[i].data_sources);
    layout.aggregator_ids.push_back(aggregators[i].control);
  }
  return layout;
}

// The chunk size once the transport is known: each chunk, with header and MAC, is one datagram.
static absl::StatusOr<uint32_t> FitChunk(uint32_t chunk_bytes, const Transport& t) {
  const size_t room = t.max_datagram() - std::min(t.max_datagram(), wire::kHeaderSize + wire::kMacSize);
  if (chunk_bytes == 0) {
    const uint32_t fit = static_cast<uint32_t>(std::min<size_t>(room, ClientOptions::kDefaultChunkBytes) & ~size_t{3});
    if (fit < 64) return absl::InvalidArgumentError(absl::StrCat("the transport's ", t.max_datagram(), "-byte datagrams leave no room for a chunk"));
    return fit;
  }
  if (chunk_bytes > room) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk_bytes ", chunk_bytes, " + header and MAC exceeds the ", TransportKindName(t.kind()), " transport's ",
        t.max_datagram(), "-byte datagrams", t.kind() == TransportOptions::Kind::kRdma ? " (the port's MTU)" : "",
        ": use at most ", room & ~size_t{3}, ", or 0 to fit"));
  }
  return chunk_bytes;
}

// Where the caller left the data plane on the IPv4 wildcard (the default), an aggregator that has
// only an IPv6 address moves it to the IPv6 one: a job's data plane runs over the family of its
// aggregators, and its workers need no setting for that. (RDMA addresses peers by IPv4 alone.)
static std::string DataBindHost(const ClientOptions& o) {
  const TransportOptions::Kind kind = o.transport.kind;
  if ((kind == TransportOptions::Kind::kUdp || kind == TransportOptions::Kind::kAuto) && o.transport.bind_host == "0.0.0.0" &&
      !o.aggregators.empty()) {
    absl::StatusOr<Address> first = ResolveHostPort(o.aggregators[0]);
    if (first.ok() && first->v6) return "::";
  }
  return o.transport.bind_host;
}

namespace {
// What the session joins with: the job's shape, and where this worker's data plane listens.
SessionOptions SessionOptionsOf(const ClientOptions& options, const Address& local) {
  SessionOptions so;
  so.aggregators = options.aggregators;
  so.job_name = options.job_name;
  so.world_size = options.world_size;
  so.rank = options.rank;
  so.chunk_bytes = options.chunk_bytes;
  so.data_host = options.data_host;
  so.data_port = local.port;
  so.data_family = local.family();
  if (local.qpn != 0) {
    // RDMA peers are reached at our GID's address, not at the address gRPC sees.
    so.data_host = local.HostString();
    so.data_qpn = local.qpn;
    so.data_qkey = options.transport.rdma.qkey;
  }
  so.rpc_timeout = options.rpc_timeout;
  so.heartbeat_interval = options.heartbeat_interval;
  so.tls = options.tls;
  so.control_dscp = options.transport.dscp[0];
  return so;
}

// The data path's options, in the layout the session joined.
EngineOptions EngineOptionsOf(const ClientOptions& options, const Session& session) {
  EngineOptions eo;
  eo.job = session.job_id();
  eo.rank = options.rank;
  eo.chunk_bytes = options.chunk_bytes;
  eo.window_chunks = static_cast<uint32_t>(options.window_bytes / options.chunk_bytes);
  eo.adaptive_window = options.adaptive_window;
  eo.path_steering = options.path_steering;
  eo.nack_filter = options.nack_filter;
  eo.congestion_delay = absl::Microseconds(options.congestion_delay_us);
  eo.pacing = options.pacing;
  eo.path_burst = options.transport.SprayBurstFor(wire::kHeaderSize + options.chunk_bytes);
  eo.world = options.world_size;
  eo.loss_bound = options.loss_bound;
  eo.class_policy = options.class_policy;
  eo.payload_encoding = options.payload_encoding;
  eo.num_layers = options.num_layers;
  eo.rescale = options.compensation == ClientOptions::Compensation::kRescale;
  eo.error_feedback = options.error_feedback;
  eo.phase_aware = options.phase_aware;
  eo.inject = options.inject;
  eo.bounded_pull = options.pull_mode == ClientOptions::PullMode::kBounded;
  eo.pull_loss_bound = options.pull_loss_bound < 0 ? options.loss_bound : options.pull_loss_bound;
  eo.repair_timeout = options.repair_timeout;
  eo.op_timeout = options.op_timeout;
  eo.max_inflight = UINT32_MAX;
  const std::vector<AggregatorInfo> aggregators = session.aggregators();
  // With one aggregator there is nothing to move to: no copies to keep.
  eo.retain_inputs = options.on_aggregator_loss == ClientOptions::AggregatorLoss::kRemap && aggregators.size() > 1;
  static_cast<EngineLayout&>(eo) = LayoutOf(aggregators, {});
  for (const AggregatorInfo& a : aggregators) eo.max_inflight = std::min(eo.max_inflight, a.max_rounds_in_flight);
  return eo;
}

// The job's workers on this host: local_size, else the launcher's LOCAL_WORLD_SIZE, else 1.
absl::StatusOr<uint32_t> ResolveLocalSize(const ClientOptions& o) {
  if (o.local_size != 0) return o.local_size;
  const std::optional<std::string> env = ProcessEnv("LOCAL_WORLD_SIZE");
  if (!env || env->empty()) return 1;
  uint32_t n = 0;
  if (!absl::SimpleAtoi(*env, &n) || n == 0 || n > o.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("LOCAL_WORLD_SIZE '", *env, "' is not a count of workers in 1..",
                                                   o.world_size, " (or set local_size)"));
  }
  return n;
}

// How this worker asks its host's dlcpd for its stage.
StageJoinOptions StageJoinOf(const ClientOptions& o) {
  StageJoinOptions so;
  so.socket_path = o.host_socket;
  so.hello = HostHello{o.job_name, o.world_size, o.rank, std::min(o.local_size, kMaxStageMembers)};
  so.timeout = std::max(absl::Seconds(60), o.rpc_timeout);
  return so;
}

// This worker's place in its host stage, or why none: then every op takes the network path (and
// where a stage was asked for, the worker logs why, once).
absl::StatusOr<StageMembership> FindHostStage(const ClientOptions& o) {
  if (!o.host_stage) return absl::FailedPreconditionError("host_stage is off");
  if (o.local_size < 2) {
    return absl::FailedPreconditionError("local_size is 1 (set local_size or LOCAL_WORLD_SIZE to the job's workers on this host)");
  }
  absl::StatusOr<StageMembership> m = JoinHostStage(StageJoinOf(o));
  if (!m.ok()) {
    DLCP_LOG(Warning) << "rank " << o.rank << " of job '" << o.job_name
                      << "': no host stage, so this worker pushes its own data: " << m.status().message();
    return m.status();
  }
  DLCP_LOG(Info) << "rank " << o.rank << " of job '" << o.job_name << "': host stage with ranks "
                 << absl::StrJoin(m->welcome.ranks, ",");
  return std::move(*m);
}

// The first worker of a stage that does not hold the whole job pushes the stage's sum.
HostStage::NetworkSubmit StageNetwork(TransferEngine* engine, const StageMembership& m, uint32_t world) {
  if (m.welcome.member != 0 || m.welcome.ranks.size() == world) return nullptr;
  const auto carries = static_cast<uint16_t>(m.welcome.ranks.size());
  return [engine, carries](uint32_t key, absl::Span<float> sum, const AllReduceOptions& options, int64_t root,
                           std::shared_ptr<LegGate> gate, OpDone done) {
    AllReduceOptions leg = options;  // on the timeline, beside the stage's op
    leg.name = absl::StrCat(options.name.empty() ? absl::StrCat("key ", key) : options.name, " network leg");
    engine->Submit(key, sum, leg, root, std::move(done), StageLeg{carries, std::move(gate)});
  };
}

// Makes this worker's HostStage of a membership: its first one, and any that forms again.
StageKeeper::MakeStage StageMaker(TransferEngine* engine, const ClientOptions& o, std::shared_ptr<Timeline> timeline) {
  HostStage::Limits limits;
  limits.timeline = std::move(timeline);
  limits.world = o.world_size;
  limits.op_timeout = o.op_timeout;
  limits.bounded_step_elems = uint64_t{kStageMaxClasses} * (o.chunk_bytes / sizeof(float));
  limits.class_policy = o.class_policy;
  limits.chunk_elems = o.chunk_bytes / sizeof(float);
  limits.num_layers = o.num_layers;
  return [engine, limits](StageMembership m, StageKeeper::Broken broken) {
    HostStage::NetworkSubmit network = StageNetwork(engine, m, limits.world);
    HostStage::RoundsElsewhere elsewhere = [engine](uint32_t key, uint32_t rounds) { engine->SkipRounds(key, rounds); };
    return std::make_unique<HostStage>(std::move(m), std::move(network), std::move(elsewhere), limits,
                                       std::move(broken));
  };
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& given) {
  if (absl::Status s = ValidateOptions(given); !s.ok()) return s;
  ClientOptions options = given;
  absl::StatusOr<std::string> job = ResolveJobName(given.job_name, ProcessEnv);
  if (!job.ok()) return job.status();
  options.job_name = *job;
  options.transport.bind_host = DataBindHost(given);
  absl::StatusOr<std::unique_ptr<Transport>> transport = CreateTransport(options.transport);
  if (!transport.ok()) return transport.status();
  absl::StatusOr<uint32_t> chunk = FitChunk(given.chunk_bytes, **transport);
  if (!chunk.ok()) return chunk.status();
  options.chunk_bytes = *chunk;
  if (options.window_bytes < options.chunk_bytes) return absl::InvalidArgumentError("window_bytes must hold at least one chunk");
  absl::StatusOr<uint32_t> local_size = ResolveLocalSize(options);
  if (!local_size.ok()) return local_size.status();
  options.local_size = *local_size;
  absl::StatusOr<StageMembership> stage = FindHostStage(options);
  SessionOptions so = SessionOptionsOf(options, (*transport)->local_address());
  if (stage.ok()) so.host_group = stage->welcome.ranks;
  absl::StatusOr<std::unique_ptr<Session>> session = Session::Join(so);
  if (!session.ok()) return session.status();
  EngineOptions eo = EngineOptionsOf(options, **session);
  if (!options.timeline.empty()) {
    absl::StatusOr<std::unique_ptr<Timeline>> timeline = Timeline::Open(
        Timeline::PathFor(options.timeline, options.rank, /*one_of_several=*/options.local_size > 1), options.rank);
    if (!timeline.ok()) {
      (*session)->Leave().IgnoreError();
      return timeline.status();
    }
    eo.timeline = std::move(*timeline);
  }
  std::unique_ptr<Client> c(new Client());
  c->timeline_ = eo.timeline;
  c->options_ = options;
  c->transport_kind_ = (*transport)->kind();
  c->session_ = std::move(*session);
  c->engine_ = std::make_unique<TransferEngine>(eo, std::move(*transport));
  if (!stage.ok()) c->stage_why_not_ = std::string(stage.status().message());
  if (stage.ok()) {
    c->stage_ = std::make_unique<StageKeeper>(std::move(*stage), StageJoinOf(options),
                                              StageMaker(c->engine_.get(), options, eo.timeline),
                                              [client = c.get()](const absl::Status& s) { client->LoseStage(s); });
  }
  c->ListenToSession(/*regroup=*/eo.retain_inputs && eo.endpoints.size() > 1);
  return c;
}

void Client::ListenToSession(bool regroup) {
  session_->set_fatal_handler([engine = engine_.get()](const absl::Status& s) { engine->FailFatal(s); });
  session_->set_key_handler([engine = engine_.get()](const AggregatorInfo& info) {
    engine->UpdateKeys(info.control, info.data_key_generation, *info.data_key, info.previous_data_key,
                       info.worker_key);
  });
  // A job that lost a worker goes on once it is back: rounds count from 0 in the new epochs.
  session_->set_rejoin_handler([this](const std::vector<uint32_t>& epochs) {
    std::vector<uint32_t> layout;
    for (uint32_t e : epochs) {
      if (e != 0) layout.push_back(e);
    }
    DLCP_LOG(Warning) << "rank " << options_.rank << ": every rank of job '" << options_.job_name
                      << "' is back; it goes on from round 0";
    // The stage first: where it formed again, the ops from here on go through it, and none may
    // reach the engine between the job going on there and the stage taking over (the restarted
    // rank waits for this one's share in that stage). Those that reached it before run again.
    const bool formed_again = stage_ && stage_->RejoinJob();
    engine_->Rejoin(std::move(layout), /*rerun_all=*/formed_again);
    session_->SetLeaveReason(absl::OkStatus());
  });
  // The network path's ops learn of a failed job from their rounds; a host stage's from this.
  if (stage_) {
    session_->set_job_failure_handler([stage = stage_.get()](const absl::Status& why) { stage->FailJob(why); });
    session_->set_stage_reporter([keeper = stage_.get()] {
      std::shared_ptr<HostStage> stage = keeper->Current();
      return stage ? stage->MemberLateness() : std::vector<RankLateness>{};
    });
  }
  if (regroup) {
    session_->set_layout_handler([this](const std::vector<size_t>& lost, const std::vector<size_t>& back,
                                        const absl::Status& why, bool planned) {
      return OnLayoutChange(lost, back, why, planned);
    });
  }
}

Client::~Client() { Close().IgnoreError(); }

namespace {
// The future-returning calls are the callback ones with a promise behind them.
std::pair<OpDone, std::future<absl::StatusOr<RoundStats>>> PromiseDone() {
  auto promise = std::make_shared<std::promise<absl::StatusOr<RoundStats>>>();
  std::future<absl::StatusOr<RoundStats>> f = promise->get_future();
  return {[promise](absl::StatusOr<RoundStats> r) { promise->set_value(std::move(r)); }, std::move(f)};
}
}  // namespace

OpDone Client::WithHeartbeatNews(uint32_t key, OpDone done) const {
  return [key, waiting = session_->waiting(), done = std::move(done)](absl::StatusOr<RoundStats> r) {
    if (r.status().code() == absl::StatusCode::kDeadlineExceeded) {
      if (const std::string silent = waiting->Describe(key); !silent.empty()) {
        r = absl::DeadlineExceededError(absl::StrCat(r.status().message(), silent));
      }
    }
    if (std::optional<v1::RankStats> slowest = waiting->Slowest(); slowest && r.ok()) {
      r->slowest_rank = static_cast<int32_t>(slowest->rank());
      r->slowest_lateness = absl::Microseconds(slowest->mean_lateness_us());
    }
    done(std::move(r));
  };
}

absl::Status DeviceTensorStatus(const DeviceTensor& tensor) {
  if (absl::Status cuda = CudaPackerAvailable(); !cuda.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("AllReduce of a device tensor: ", cuda.message()));
  }
  if (tensor.data == nullptr || tensor.elems == 0) return absl::InvalidArgumentError("AllReduce of an empty device tensor");
  if (static_cast<uint8_t>(tensor.type) > static_cast<uint8_t>(ElemType::kBF16)) {
    return absl::InvalidArgumentError("device tensor of an unknown element type");
  }
  return absl::OkStatus();
}

std::future<absl::StatusOr<RoundStats>> Client::AllReduceDevice(uint32_t key, const DeviceTensor& tensor,
                                                                const AllReduceOptions& options) {
  auto [done, f] = PromiseDone();
  AllReduceDeviceAsync(key, tensor, options, std::move(done));
  return std::move(f);
}

void Client::AllReduceDeviceAsync(uint32_t key, const DeviceTensor& tensor, const AllReduceOptions& options,
                                  OpDone done) {
  AllReduceOptions staged;
  if (std::shared_ptr<HostStage> stage = ThroughHostStage(options, &staged)) {
    if (absl::Status s = DeviceTensorStatus(tensor); !s.ok()) return done(s);
    return stage->SubmitDevice(key, tensor, staged, WithHeartbeatNews(key, std::move(done)));
  }
  engine_->SubmitDevice(key, tensor, options, WithHeartbeatNews(key, std::move(done)));
}

std::future<absl::StatusOr<RoundStats>> Client::AllReduce(uint32_t key, absl::Span<float> data,
                                                          const AllReduceOptions& options) {
  auto [done, f] = PromiseDone();
  AllReduceAsync(key, data, options, std::move(done));
  return std::move(f);
}

void Client::LoseStage(const absl::Status& why) {
  // Its ops fail now, naming the gone worker, and so do the job's until the aggregators see that
  // rank back (its heartbeats stop, as for any worker that dies). Until then, and should the gone
  // rank come back without the stage, this worker's ops push its own data (StageKeeper).
  session_->SetLeaveReason(why);  // should this worker leave over it, the other hosts hear the cause
  {
    std::lock_guard<std::mutex> lock(stage_mu_);
    stage_why_not_ = std::string(why.message());
  }
  DLCP_LOG(Warning) << "rank " << options_.rank << " of job '" << options_.job_name << "': its host stage lost a worker ("
                    << why << "); this worker pushes its own data until the stage forms again";
}

HostStageInfo Client::host_stage() const {
  HostStageInfo info;
  std::shared_ptr<HostStage> stage = stage_ ? stage_->Current() : nullptr;
  if (stage == nullptr) {
    info.ranks = {options_.rank};
    info.local_size = options_.local_size;
    std::lock_guard<std::mutex> lock(stage_mu_);
    info.why_not = stage_why_not_;
    return info;
  }
  info.formed = true;
  info.ranks = stage->ranks();
  info.local_rank = stage->member();
  info.local_size = static_cast<uint32_t>(info.ranks.size());
  info.pushes = info.local_rank == 0;
  info.whole_job = info.local_size == options_.world_size;
  return info;
}

std::shared_ptr<HostStage> Client::ThroughHostStage(const AllReduceOptions& options, AllReduceOptions* staged) const {
  std::shared_ptr<HostStage> stage = stage_ ? stage_->Current() : nullptr;
  if (stage == nullptr) return nullptr;
  *staged = options;
  staged->loss_bound = options.loss_bound >= 0 ? options.loss_bound : options_.loss_bound;
  if (!(staged->loss_bound <= 1)) return nullptr;  // the network path names it
  return stage;
}

void Client::AllReduceAsync(uint32_t key, absl::Span<float> data, const AllReduceOptions& options, OpDone done) {
  AllReduceOptions staged;
  if (std::shared_ptr<HostStage> stage = ThroughHostStage(options, &staged); stage && data.data() != nullptr) {
    return stage->Submit(key, data, staged, -1, WithHeartbeatNews(key, std::move(done)));
  }
  engine_->Submit(key, data, options, -1, WithHeartbeatNews(key, std::move(done)));
}

std::future<absl::StatusOr<RoundStats>> Client::Broadcast(uint32_t key, absl::Span<float> data, uint32_t root) {
  auto [done, f] = PromiseDone();
  BroadcastAsync(key, data, root, std::move(done));
  return std::move(f);
}

void Client::BroadcastAsync(uint32_t key, absl::Span<float> data, uint32_t root, OpDone done) {
  if (root >= options_.world_size) {
    return done(absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", root, " is not below the world size ", options_.world_size)));
  }
  AllReduceOptions o;
  o.loss_bound = 0;
  AllReduceOptions staged;
  if (std::shared_ptr<HostStage> stage = ThroughHostStage(o, &staged); stage && data.data() != nullptr) {
    return stage->Submit(key, data, staged, static_cast<int64_t>(root), WithHeartbeatNews(key, std::move(done)));
  }
  engine_->Submit(key, data, o, static_cast<int64_t>(root), WithHeartbeatNews(key, std::move(done)));
}

bool Client::OnLayoutChange(const std::vector<size_t>& lost, const std::vector<size_t>& back,
                            const absl::Status& why, bool planned) {
  std::lock_guard<std::mutex> lock(regroup_mu_);
  if (closing_) return false;
  if (regrouping_) {
    // One regroup at a time. A returning aggregator can wait for the next one, and so can a
    // draining one, which serves until its workers have moved off it (a rolling restart that
    // drains the next node while the last one is being taken back); a loss in the middle of
    // one is more than this job can take.
    if (!lost.empty() && !planned) {
      engine_->FailFatal(absl::Status(why.code(), absl::StrCat(why.message(), " during a regroup")));
    } else if (!lost.empty()) {
      DLCP_LOG(Info) << "rank " << options_.rank << ": " << why << "; moving off it once the regroup under way ends";
    }
    return false;
  }
  std::string names;
  for (size_t i : lost.empty() ? back : lost) absl::StrAppend(&names, names.empty() ? "" : ", ", options_.aggregators[i]);
  absl::Status cause = why;
  if (lost.empty()) {
    cause = absl::UnavailableError(absl::StrCat("aggregator ", names, " came back"));
    DLCP_LOG(Warning) << "rank " << options_.rank << ": aggregator(s) " << names
                      << " answer again; giving them their share back";
  } else {
    DLCP_LOG(Warning) << "rank " << options_.rank << " lost aggregator(s) " << names << " (" << why
                      << "); moving their share to the others";
  }
  regrouping_ = true;
  if (regroup_.joinable()) regroup_.join();  // the previous one, which has ended
  // The layout to regroup on, decided here: the session marks a returning aggregator found only
  // once this accepts it.
  std::vector<bool> layout = session_->lost();
  for (size_t i : back) layout[i] = false;
  regroup_ = std::thread([this, g = ++generation_, layout, cause] { Regroup(g, layout, cause); });
  return true;
}

void Client::Regroup(uint32_t generation, std::vector<bool> lost, absl::Status why) {
  const absl::Time start = MonotonicNow();
  // Workers notice a loss up to a heartbeat interval apart, each within the deadline, and a
  // return within a heartbeat interval or two.
  absl::Duration deadline = session_->heartbeat_timeout();
  if (deadline == absl::InfiniteDuration()) deadline = absl::Seconds(3);
  const absl::Duration wait = 2 * deadline + absl::Seconds(2);
  absl::Status failed;
  absl::StatusOr<std::vector<KeyProgress>> progress = engine_->PauseForRegroup(absl::Seconds(5));
  if (!progress.ok()) {
    failed = progress.status();
  } else if (absl::StatusOr<Session::RegroupResult> r = session_->Regroup(generation, lost, *progress, wait); !r.ok()) {
    failed = r.status();
  } else {
    EngineLayout layout = LayoutOf(session_->aggregators(), r->epochs);
    const size_t survivors = layout.epochs.size();
    engine_->Resume(std::move(layout), std::move(r->agreed));
    DLCP_LOG(Warning) << "rank " << options_.rank << " regrouped on " << survivors
                      << " aggregator(s) in " << absl::FormatDuration(MonotonicNow() - start);
  }
  if (!failed.ok()) {
    engine_->FailFatal(absl::Status(why.code(), absl::StrCat(why.message(), "; the regroup that followed failed: ",
                                                             failed.ToString())));
  }
  std::lock_guard<std::mutex> lock(regroup_mu_);
  regrouping_ = false;
}

absl::Status Client::Close() {
  {
    std::lock_guard<std::mutex> lock(regroup_mu_);
    closing_ = true;
  }
  if (session_) {
    session_->set_fatal_handler(nullptr);  // the engine is going away
    session_->set_layout_handler(nullptr);
    session_->set_rejoin_handler(nullptr);
    session_->set_job_failure_handler(nullptr);
    session_->set_stage_reporter(nullptr);
    session_->set_key_handler(nullptr);
  }
  // The stage first: its first worker's network leg is an op of the engine, which may write into
  // the stage's memory until the engine stops; that memory is unmapped only with the client.
  if (stage_) stage_->Stop(absl::CancelledError("dlcp client closed"));
  if (engine_) engine_->Stop(absl::CancelledError("dlcp client closed"));
  if (regroup_.joinable()) regroup_.join();  // its waits end with the engine stopped, or by deadline
  if (timeline_) timeline_->Close();
  return session_ ? session_->Leave() : absl::OkStatus();
}

uint32_t Client::rank() const { return options_.rank; }
uint32_t Client::world_size() const { return options_.world_size; }
uint32_t Client::job_id() const { return session_->job_id(); }

std::map<std::string, uint64_t> Client::Rejects() const {
  std::map<std::string, uint64_t> out;
  if (!engine_) return out;
  const auto counts = engine_->rejects();
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] > 0) out[wire::RejectName(static_cast<wire::Reject>(i))] = counts[i];
  }
  return out;
}

uint64_t Client::ReceiveOverflows() const { return engine_ ? engine_->receive_overflows() : 0; }
uint64_t Client::ReceiveQueueRanDry() const { return engine_ ? engine_->receive_queue_ran_dry() : 0; }

absl::StatusOr<std::map<std::string, uint64_t>> Client::PortCounters() const {
  std::map<std::string, uint64_t> out;
  if (!engine_) return out;
  const PortCounterSource* port = engine_->port_counters();
  if (port == nullptr) return out;  // no port of its own (UDP)
  absl::StatusOr<std::vector<dlcp::PortCounter>> counters = port->ReadAll();
  if (!counters.ok()) return counters.status();
  for (const dlcp::PortCounter& c : *counters) out[c.name] = c.value;
  return out;
}

absl::StatusOr<uint64_t> Client::PortCounter(const std::string& name) const {
  if (!engine_) return absl::FailedPreconditionError("the client has no data plane");
  const PortCounterSource* port = engine_->port_counters();
  if (port == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("a ", TransportKindName(engine_->transport_kind()), " transport has no port counter ", name));
  }
  return port->Read(name);
}

}  // namespace dlcp
