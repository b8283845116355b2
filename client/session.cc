#include "client/session.h"

#include "common/base/clock.h"
#include "common/rpc/heartbeat.h"
#include "common/rpc/socket_marks.h"

#include <grpcpp/create_channel.h>

#include <algorithm>

#include <grpc/impl/codegen/grpc_types.h>

#include <sys/types.h>
#include <unistd.h>

#include <random>

#include "absl/strings/str_cat.h"
#include "common/transport/address.h"
#include "common/base/build_config.h"
#include "common/base/host_port.h"
#include "common/base/log.h"
#include "common/base/utf8.h"
#include "common/wire/header.h"
#include "common/wire/version_check.h"

namespace dlcp {

absl::Status FromGrpcStatus(const grpc::Status& s, const std::string& context) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), absl::StrCat(context, ": ", s.error_message()));
}

namespace {

std::string LocalHostName() {
  char name[256] = {};
  return ::gethostname(name, sizeof(name) - 1) == 0 ? std::string(name) : std::string();
}

// An aggregator's data keys as Join and Heartbeat answers carry them, into `info`.
absl::Status ParseKeys(const std::string& control, const std::string& newest, const std::string& previous,
                       const std::string& worker, uint32_t generation, AggregatorInfo* info) {
  if (newest.empty()) return absl::OkStatus();
  if (newest.size() != 32 || (!previous.empty() && previous.size() != 32) || (!worker.empty() && worker.size() != 32)) {
    return absl::FailedPreconditionError(absl::StrCat("aggregator ", control, " sent a data key of ", newest.size(),
                                                      " bytes (one before it of ", previous.size(),
                                                      ", this worker's of ", worker.size(), "), not 32"));
  }
  const auto key_of = [](const std::string& b) {
    return wire::MacKeyFromBytes(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(b.data()), b.size()));
  };
  info->data_key = key_of(newest);
  info->previous_data_key.reset();
  if (!previous.empty()) info->previous_data_key = key_of(previous);
  info->worker_key.reset();
  if (!worker.empty()) info->worker_key = key_of(worker);
  info->data_key_generation = generation;
  return absl::OkStatus();
}

// How often a lost aggregator is probed, and the most a channel waits between connection
// attempts.
absl::Duration ProbeInterval(absl::Duration heartbeat_interval) {
  return std::max(heartbeat_interval / 4, absl::Milliseconds(50));
}

// A Leave that failed so: the aggregator is unreachable, or no longer counts the worker (its
// job closed, or it dropped the worker after a silence).
bool LeftAlready(const grpc::Status& st) {
  switch (st.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::FAILED_PRECONDITION:
      return true;
    default:
      return false;
  }
}

}  // namespace

absl::StatusOr<Session::Joined> Session::JoinOne(const SessionOptions& options, v1::Aggregator::Stub* stub,
                                                  const std::string& control) {
  // Before any call: gRPC would spend the whole deadline on a target it cannot parse.
  if (absl::StatusOr<std::pair<std::string, uint16_t>> hp = SplitHostPort(control); !hp.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("aggregator: ", hp.status().message()));
  }
  std::unique_ptr<JoinCall> call = StartJoin(options, stub, options.rpc_timeout);
  return FinishJoin(options, stub, control, *call);
}

std::unique_ptr<Session::JoinCall> Session::StartJoin(const SessionOptions& options, v1::Aggregator::Stub* stub,
                                                      absl::Duration timeout) {
  v1::JoinRequest req;
  req.set_job_name(options.job_name);
  req.set_world_size(options.world_size);
  req.set_rank(options.rank);
  req.set_chunk_bytes(options.chunk_bytes);
  req.set_data_host(options.data_host);
  req.set_data_port(options.data_port);
  req.set_data_qpn(options.data_qpn);
  req.set_data_qkey(options.data_qkey);
  req.set_worker_keys(true);
  req.set_wire_version(wire::kVersion);
  req.set_client_version(DLCP_VERSION);
  req.set_incarnation(options.incarnation);
  req.set_client_host(options.client_host);
  req.set_client_pid(static_cast<uint32_t>(::getpid()));
  for (const std::string& a : options.resolved_aggregators) req.add_aggregators(a);
  for (uint32_t r : options.host_group) req.add_host_group(r);
  return std::make_unique<JoinCall>(
      [stub](grpc::ClientContext* ctx, const v1::JoinRequest* rq, v1::JoinResponse* rs, auto cb) {
        stub->async()->Join(ctx, rq, rs, std::move(cb));
      },
      std::move(req), timeout);
}

absl::StatusOr<Session::Joined> Session::FinishJoin(const SessionOptions& options, v1::Aggregator::Stub* stub,
                                                    const std::string& control, JoinCall& call) {
  absl::StatusOr<std::pair<std::string, uint16_t>> hp = SplitHostPort(control);
  if (!hp.ok()) return absl::InvalidArgumentError(absl::StrCat("aggregator: ", hp.status().message()));
  const std::string& control_host = hp->first;
  const grpc::Status& st = call.Wait();
  const v1::JoinResponse& resp = call.response();
  if (!st.ok()) {
    const absl::Status s = FromGrpcStatus(st, absl::StrCat("join job '", options.job_name, "' at aggregator ", control));
    return absl::Status(s.code(), absl::StrCat(s.message(), HandshakeHint(st.error_message(), options.tls.plaintext)));
  }
  if (absl::Status s = wire::CheckPeerWireVersion(resp.wire_version(), resp.aggregator_version(),
                                                  absl::StrCat("aggregator ", control), "this client");
      !s.ok()) {
    // The aggregator took the join: leave at once, saying why, so the other workers learn it now
    // and not from a heartbeat deadline.
    v1::LeaveRequest leave;
    leave.set_job_id(resp.job_id());
    leave.set_rank(options.rank);
    std::string reason(s.message());
    TruncateUtf8(&reason, 512);
    leave.set_reason(std::move(reason));
    v1::LeaveResponse left;
    CallWithDeadline(
        [&](grpc::ClientContext* ctx, const v1::LeaveRequest* rq, v1::LeaveResponse* rs, auto cb) {
          stub->async()->Leave(ctx, rq, rs, std::move(cb));
        },
        leave, &left, options.rpc_timeout);
    return s;
  }
  if (resp.data_endpoints().empty()) {
    return absl::FailedPreconditionError(absl::StrCat("aggregator ", control, " has no data endpoints"));
  }
  Joined out;
  out.job_id = resp.job_id();
  out.heartbeat_timeout = absl::Milliseconds(resp.heartbeat_timeout_ms());
  AggregatorInfo& info = out.info;
  info.control = control;
  info.max_rounds_in_flight = resp.max_rounds_in_flight();
  info.epoch = resp.epoch();
  info.rejoins = resp.rejoins();
  if (absl::Status s = ParseKeys(control, resp.data_key(), resp.previous_data_key(), resp.worker_key(),
                                 resp.data_key_generation(), &info);
      !s.ok()) {
    return s;
  }
  for (const v1::Endpoint& e : resp.data_endpoints()) {
    absl::StatusOr<Address> a =
        ResolveAddress(e.host().empty() ? control_host : e.host(), static_cast<uint16_t>(e.port()), options.data_family);
    if (!a.ok()) return a.status();
    if ((e.qpn() != 0) != (options.data_qpn != 0) || e.qkey() != options.data_qkey) {
      return absl::FailedPreconditionError(absl::StrCat(
          "aggregator ", control, " offers a data endpoint over ", e.qpn() != 0 ? "RDMA" : "UDP",
          e.qpn() != 0 ? absl::StrCat(" (Q_Key 0x", absl::Hex(e.qkey()), ")") : "", ", which this client's ",
          options.data_qpn != 0 ? absl::StrCat("RDMA (Q_Key 0x", absl::Hex(options.data_qkey), ")") : "UDP",
          " transport cannot reach"));
    }
    a->qpn = e.qpn();
    std::vector<Address> sources;
    for (uint32_t p : e.spray_ports()) {
      if (p == 0 || p > 65535) {
        return absl::FailedPreconditionError(absl::StrCat("aggregator ", control, " sent spray port ", p));
      }
      Address source = *a;
      source.port = static_cast<uint16_t>(p);
      sources.push_back(source);
    }
    for (uint32_t q : e.spray_qpns()) {
      if (q == 0 || q > 0xffffff) {
        return absl::FailedPreconditionError(absl::StrCat("aggregator ", control, " sent spray queue pair ", q));
      }
      Address source = *a;
      source.port = 0;
      source.qpn = q;
      sources.push_back(source);
    }
    info.data_sources.push_back(std::move(sources));
    info.data_endpoints.push_back(*a);
  }
  return out;
}

namespace {
// What a Join says of this worker that the aggregator checks its job against (Roster): an
// incarnation, and the aggregators as addresses, so that two workers naming one aggregator
// differently (a host name, an address) agree.
SessionOptions WithIdentity(const SessionOptions& given) {
  SessionOptions o = given;
  while (o.incarnation == 0) o.incarnation = (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  if (o.client_host.empty()) o.client_host = LocalHostName();
  if (o.resolved_aggregators.empty()) {
    for (const std::string& a : o.aggregators) {
      absl::StatusOr<Address> resolved = ResolveHostPort(a);
      o.resolved_aggregators.push_back(resolved.ok() ? resolved->ToString() : a);
    }
  }
  return o;
}
}  // namespace

absl::StatusOr<std::unique_ptr<Session>> Session::Join(const SessionOptions& given) {
  if (given.aggregators.empty()) return absl::InvalidArgumentError("no aggregators given");
  const SessionOptions options = WithIdentity(given);
  absl::StatusOr<ChannelSecurity> security = MakeChannelSecurity(options.tls);
  if (!security.ok()) return security.status();
  MarkChannelDscp(&security->arguments, options.control_dscp);
  // A lost aggregator that comes back is noticed at the next probe (ProbeInterval), not after
  // gRPC's default reconnect backoff (up to 2 minutes): a probe on a channel still backing off
  // would fail without trying.
  const int backoff_ms = static_cast<int>(absl::ToInt64Milliseconds(ProbeInterval(options.heartbeat_interval)));
  security->arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, backoff_ms);
  security->arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, backoff_ms);
  std::unique_ptr<Session> s(new Session());
  s->options_ = options;
  s->heartbeat_interval_ = options.heartbeat_interval;
  for (const std::string& control : options.aggregators) {
    auto stub = v1::Aggregator::NewStub(grpc::CreateCustomChannel(control, security->credentials, security->arguments));
    absl::StatusOr<Joined> joined = JoinOne(options, stub.get(), control);
    if (!joined.ok()) return joined.status();
    if (s->job_id_ != 0 && s->job_id_ != joined->job_id) {
      return absl::FailedPreconditionError(absl::StrCat("aggregator ", control, " gave job id ", joined->job_id,
                                                        ", others gave ", s->job_id_));
    }
    s->job_id_ = joined->job_id;
    if (joined->heartbeat_timeout > absl::ZeroDuration()) {
      s->heartbeat_interval_ = HeartbeatInterval(s->heartbeat_interval_, joined->heartbeat_timeout);
      s->heartbeat_timeout_ = std::min(s->heartbeat_timeout_, joined->heartbeat_timeout);
    }
    s->aggregators_.push_back(std::move(joined->info));
    s->stubs_.push_back(std::move(stub));
  }
  s->last_ok_.assign(s->aggregators_.size(), MonotonicNow());
  s->lost_.assign(s->aggregators_.size(), false);
  s->rejoined_epochs_.assign(s->aggregators_.size(), 0);
  for (const AggregatorInfo& a : s->aggregators_) s->rejoins_ = std::max(s->rejoins_, a.rejoins);
  s->heartbeat_ = std::thread([raw = s.get()] { raw->HeartbeatLoop(); });
  return s;
}

Session::~Session() { Leave().IgnoreError(); }

void Session::HeartbeatLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  absl::Time next_beat = MonotonicNow() + heartbeat_interval_;
  for (;;) {
    // A lost aggregator is probed four times per heartbeat interval: when it comes back, each
    // worker finds it within a quarter interval of the first, whose regroup waits for them all.
    const bool probing = layout_handler_ && std::find(lost_.begin(), lost_.end(), true) != lost_.end();
    absl::Duration wait = next_beat - MonotonicNow();
    if (probing) wait = std::min(wait, ProbeInterval(heartbeat_interval_));
    if (cv_.wait_for(lock, absl::ToChronoMilliseconds(std::max(wait, absl::ZeroDuration())),
                     [this] { return stopping_; })) {
      break;
    }
    const bool beat = MonotonicNow() >= next_beat;
    if (beat) next_beat = MonotonicNow() + heartbeat_interval_;
    const std::vector<bool> lost = lost_;
    LayoutHandler on_change = layout_handler_;
    lock.unlock();
    HeartbeatPass(lost, beat, on_change);
    lock.lock();
  }
}

// Probes of the lost (joining again: a restarted aggregator knows nothing of the job until then)
// and beats to the others, all at once and each bounded by the heartbeat interval: aggregators
// that do not answer (a node gone without a reset) cost the others' beats one interval in all,
// not the control-call deadline each, which would outlast the aggregators' heartbeat deadline.
void Session::HeartbeatPass(const std::vector<bool>& lost, bool beat, const LayoutHandler& on_change) {
  const absl::Duration call_timeout = std::min(options_.rpc_timeout, heartbeat_interval_);
  std::vector<std::pair<size_t, std::unique_ptr<JoinCall>>> probes;
  for (size_t i = 0; i < stubs_.size() && on_change; ++i) {
    if (lost[i]) probes.emplace_back(i, StartJoin(options_, stubs_[i].get(), call_timeout));
  }
  std::vector<RankLateness> stage_members;
  if (StageReporter reporter = beat ? stage_reporter() : nullptr) stage_members = reporter();
  std::vector<std::pair<size_t, std::unique_ptr<HeartbeatCall>>> beats;
  for (size_t i = 0; i < stubs_.size() && beat; ++i) {
    if (!lost[i]) beats.emplace_back(i, StartHeartbeat(i, call_timeout, stage_members));
  }
  Losses losses;
  for (auto& [i, call] : beats) ReadHeartbeat(i, *call, on_change, &losses);
  for (auto& [i, call] : probes) {
    ProbeLost(i, FinishJoin(options_, stubs_[i].get(), aggregators_[i].control, *call), on_change);
  }
  NoteRejoin(lost);
  ApplyLosses(lost, on_change, std::move(losses));
}

std::unique_ptr<Session::HeartbeatCall> Session::StartHeartbeat(size_t i, absl::Duration timeout,
                                                                 const std::vector<RankLateness>& stage_members) {
  v1::HeartbeatRequest req;
  req.set_job_id(job_id_);
  req.set_rank(options_.rank);
  req.set_incarnation(options_.incarnation);
  for (const RankLateness& m : stage_members) {
    v1::RankStats* out = req.add_stage_members();
    out->set_rank(m.rank);
    out->set_rounds(m.rounds);
    out->set_mean_lateness_us(m.mean_us);
    out->set_p50_lateness_us(m.p50_us);
    out->set_p99_lateness_us(m.p99_us);
    out->set_last(m.last);
    out->set_ahead_of_last_us(m.ahead_us);
  }
  {
    std::lock_guard<std::mutex> guard(mu_);
    req.set_data_key_generation(aggregators_[i].data_key_generation);
  }
  return std::make_unique<HeartbeatCall>(
      [this, i](grpc::ClientContext* ctx, const v1::HeartbeatRequest* rq, v1::HeartbeatResponse* rs, auto cb) {
        stubs_[i]->async()->Heartbeat(ctx, rq, rs, std::move(cb));
      },
      std::move(req), timeout);
}

// An aggregator gone (or going): the job goes on without it if it can (fail-over), or fails.
void Session::Losses::Add(size_t i, absl::Status s, bool planned) {
  (planned ? draining : lost).push_back(i);
  absl::Status& first = planned ? why_draining : why;
  if (first.ok()) first = std::move(s);
}

void Session::ReadHeartbeat(size_t i, HeartbeatCall& call, const LayoutHandler& on_change, Losses* losses) {
  const grpc::Status& st = call.Wait();
  const v1::HeartbeatResponse& resp = call.response();
  const auto lose = [&](absl::Status s, bool planned) {
    if (!on_change) return Fatal(s);
    losses->Add(i, std::move(s), planned);
  };
  if (st.ok() && resp.draining()) {
    // It is shutting down (SIGTERM) and answers so while it tells its workers: it is lost now,
    // not a heartbeat deadline after the process is gone.
    lose(absl::UnavailableError(absl::StrCat("aggregator ", aggregators_[i].control, " is shutting down (draining)")),
         /*planned=*/true);
  } else if (st.ok()) {
    last_ok_[i] = MonotonicNow();
    waiting_->Update(aggregators_[i].control, resp);
    if (!resp.job_failure().empty()) NoteJobFailure(i, resp.job_failure());
    if (resp.rejoins() > rejoins_) rejoined_epochs_[i] = resp.epoch();
    NoteKeys(i, resp);
  } else if (st.error_code() == grpc::StatusCode::FAILED_PRECONDITION ||
             st.error_code() == grpc::StatusCode::NOT_FOUND) {
    // The aggregator answered: it no longer counts this worker in the job (e.g. after it was
    // silent past the deadline). Nothing this worker sends can complete.
    Fatal(absl::AbortedError(
        absl::StrCat("aggregator ", aggregators_[i].control, " dropped rank ", options_.rank, " of job '",
                     options_.job_name, "': ", st.error_message())));
  } else if (MonotonicNow() - last_ok_[i] > heartbeat_timeout_) {
    // No answer for longer than the deadline: the aggregator that owns part of every tensor is
    // gone. Fail now rather than at each op's deadline, unless the job can go on without it.
    lose(absl::UnavailableError(absl::StrCat("aggregator ", aggregators_[i].control, " unreachable for ",
                                             absl::FormatDuration(MonotonicNow() - last_ok_[i]), ": ",
                                             st.error_message())),
         /*planned=*/false);
  } else {
    DLCP_LOG(Warning) << "heartbeat to " << aggregators_[i].control << " failed: " << st.error_message();
  }
}

void Session::ApplyLosses(const std::vector<bool>& lost, const LayoutHandler& on_change, Losses losses) {
  // A drain waits while another aggregator is lost: some worker may be taking that one back
  // already, and a regroup that moved off the draining one meanwhile would not agree with its
  // regroup (each needs every worker). The draining one serves while workers still ask.
  if (losses.lost.empty() && !losses.draining.empty() && std::find(lost.begin(), lost.end(), true) != lost.end()) {
    DLCP_LOG(Info) << losses.why_draining << "; moving off it once the lost aggregator(s) are back";
    losses.draining.clear();
  }
  // A loss takes the draining aggregators along; drains alone may wait for a regroup under way.
  const bool planned = losses.lost.empty();
  absl::Status why = planned ? losses.why_draining : losses.why;
  std::vector<size_t> gone = std::move(losses.lost);
  gone.insert(gone.end(), losses.draining.begin(), losses.draining.end());
  if (gone.empty()) return;
  size_t alive = 0;
  {
    std::lock_guard<std::mutex> guard(mu_);
    for (size_t i : gone) lost_[i] = true;
    for (bool l : lost_) alive += !l;
  }
  if (alive == 0) {
    Fatal(absl::Status(why.code(), absl::StrCat(why.message(), "; no aggregator of the job is left")));
  } else if (!on_change(gone, {}, why, planned) && planned) {
    // Not now: they still serve, and say so again at the next heartbeat.
    std::lock_guard<std::mutex> guard(mu_);
    for (size_t i : gone) lost_[i] = false;
  }
}

void Session::NoteKeys(size_t i, const v1::HeartbeatResponse& resp) {
  if (resp.data_key().empty()) return;  // an aggregator without data authentication
  AggregatorInfo next;
  KeyHandler handler;
  {
    std::lock_guard<std::mutex> lock(mu_);
    AggregatorInfo& info = aggregators_[i];
    if (!info.data_key.has_value()) return;  // joined without: the data path does not sign there
    next = info;
    if (absl::Status s = ParseKeys(info.control, resp.data_key(), resp.previous_data_key(), resp.worker_key(),
                                   resp.data_key_generation(), &next);
        !s.ok()) {
      DLCP_LOG(Warning) << "heartbeat answer ignored: " << s;
      return;
    }
    if (next.data_key_generation < info.data_key_generation ||
        (next.data_key_generation == info.data_key_generation &&
         next.previous_data_key.has_value() == info.previous_data_key.has_value())) {
      return;  // nothing new (or an answer that overtook a newer one)
    }
    info = next;
    handler = key_handler_;
  }
  DLCP_LOG(Info) << "aggregator " << next.control << ": data key " << next.data_key_generation
                 << (next.previous_data_key ? ", the one before it still accepted" : ", the one before it dropped");
  if (handler) handler(next);
}

void Session::set_key_handler(KeyHandler handler) {
  std::vector<AggregatorInfo> now;
  {
    std::lock_guard<std::mutex> lock(mu_);
    key_handler_ = handler;
    for (const AggregatorInfo& info : aggregators_) {
      if (info.data_key.has_value()) now.push_back(info);
    }
  }
  // Keys may have moved on since the caller read aggregators(): it hears of where they are now.
  if (handler) {
    for (const AggregatorInfo& info : now) handler(info);
  }
}

void Session::NoteRejoin(const std::vector<bool>& lost) {
  for (size_t i = 0; i < rejoined_epochs_.size(); ++i) {
    if (!lost[i] && rejoined_epochs_[i] == 0) return;  // not every aggregator yet
  }
  std::vector<uint32_t> epochs(rejoined_epochs_.size(), 0);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < epochs.size(); ++i) {
      if (lost[i]) continue;
      epochs[i] = aggregators_[i].epoch = rejoined_epochs_[i];
    }
  }
  ++rejoins_;
  rejoined_epochs_.assign(rejoined_epochs_.size(), 0);
  RejoinHandler handler;
  {
    std::lock_guard<std::mutex> lock(mu_);
    handler = rejoin_handler_;
  }
  if (handler) handler(epochs);
}

void Session::NoteJobFailure(size_t i, const std::string& reason) {
  JobFailureHandler handler;
  {
    std::lock_guard<std::mutex> lock(mu_);
    handler = job_failure_handler_;
  }
  if (handler) {
    handler(absl::AbortedError(absl::StrCat("aggregator ", aggregators_[i].control, ": job '", options_.job_name,
                                            "' failed: ", reason)));
  }
}

void Session::set_job_failure_handler(JobFailureHandler handler) {
  std::lock_guard<std::mutex> lock(mu_);
  job_failure_handler_ = std::move(handler);
}

void Session::set_stage_reporter(StageReporter reporter) {
  std::lock_guard<std::mutex> lock(mu_);
  stage_reporter_ = std::move(reporter);
}

Session::StageReporter Session::stage_reporter() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stage_reporter_;
}

void Session::set_rejoin_handler(RejoinHandler handler) {
  std::lock_guard<std::mutex> lock(mu_);
  rejoin_handler_ = std::move(handler);
}

void Session::set_layout_handler(LayoutHandler handler) {
  std::lock_guard<std::mutex> lock(mu_);
  layout_handler_ = std::move(handler);
}

void Session::ProbeLost(size_t i, absl::StatusOr<Joined> joined, const LayoutHandler& on_change) {
  if (!joined.ok()) return;
  if (joined->job_id != job_id_) {
    DLCP_LOG(Warning) << "aggregator " << aggregators_[i].control << " is back but gave job id " << joined->job_id
                      << ", not " << job_id_ << "; leaving it out";
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    aggregators_[i] = std::move(joined->info);
  }
  last_ok_[i] = MonotonicNow();
  // Only once the client takes it in does it count (it may be busy with another regroup, and
  // then the next probe offers it again).
  if (on_change({}, {i}, absl::OkStatus(), /*planned=*/false)) {
    std::lock_guard<std::mutex> lock(mu_);
    lost_[i] = false;
  }
}

std::vector<AggregatorInfo> Session::aggregators() const {
  std::lock_guard<std::mutex> lock(mu_);
  return aggregators_;
}

std::vector<bool> Session::lost() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lost_;
}

absl::StatusOr<Session::RegroupResult> Session::Regroup(uint32_t generation, const std::vector<bool>& lost,
                                                        const std::vector<KeyProgress>& progress, absl::Duration wait) {
  const std::vector<AggregatorInfo> all = aggregators();
  if (lost.size() != all.size()) return absl::InvalidArgumentError("regroup: one lost flag per aggregator");
  std::vector<std::string> lost_ids;
  std::optional<size_t> coordinator;
  for (size_t i = 0; i < all.size(); ++i) {
    if (lost[i]) {
      lost_ids.push_back(all[i].control);
    } else if (!coordinator || all[i].control < all[*coordinator].control) {
      coordinator = i;  // the same on every worker, however each lists the aggregators
    }
  }
  if (!coordinator) return absl::FailedPreconditionError("no aggregator left to regroup with");
  RegroupResult out;
  out.epochs.assign(all.size(), 0);
  // The coordinator first: its answer comes once every worker has paused, so no worker starts
  // the new layout while another still pushes the old one.
  std::vector<size_t> order{*coordinator};
  for (size_t i = 0; i < all.size(); ++i) {
    if (!lost[i] && i != *coordinator) order.push_back(i);
  }
  for (size_t i : order) {
    v1::RegroupRequest req;
    req.set_job_id(job_id_);
    req.set_rank(options_.rank);
    req.set_generation(generation);
    for (const std::string& id : lost_ids) req.add_lost(id);
    const bool coordinate = i == *coordinator;
    req.set_coordinate(coordinate);
    if (coordinate) {
      req.set_wait_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(wait)));
      for (const KeyProgress& k : progress) {
        v1::KeyRounds* kr = req.add_keys();
        kr->set_key(k.key);
        kr->set_done(k.done);
      }
    }
    v1::RegroupResponse resp;
    grpc::Status st = CallWithDeadline(
        [&](grpc::ClientContext* ctx, const v1::RegroupRequest* rq, v1::RegroupResponse* rs, auto cb) {
          stubs_[i]->async()->Regroup(ctx, rq, rs, std::move(cb));
        },
        req, &resp, options_.rpc_timeout + (coordinate ? wait : absl::ZeroDuration()));
    if (!st.ok()) return FromGrpcStatus(st, absl::StrCat("regroup at aggregator ", all[i].control));
    if (resp.epoch() == 0) {
      return absl::FailedPreconditionError(absl::StrCat("aggregator ", all[i].control, " gave epoch 0"));
    }
    out.epochs[i] = resp.epoch();
    if (coordinate) {
      for (const v1::KeyRounds& k : resp.keys()) out.agreed.push_back(KeyProgress{k.key(), k.done(), k.done_max()});
    }
  }
  return out;
}

void Session::Fatal(const absl::Status& status) {
  std::function<void(const absl::Status&)> handler;
  {
    std::lock_guard<std::mutex> lock(mu_);
    handler = fatal_;
    if (fatal_status_.ok()) fatal_status_ = status;
  }
  if (handler) handler(status);
}

void Session::SetLeaveReason(const absl::Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  leave_reason_ = why;
}

void Session::set_fatal_handler(std::function<void(const absl::Status&)> handler) {
  std::lock_guard<std::mutex> lock(mu_);
  fatal_ = std::move(handler);
}

absl::Status Session::Leave() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (left_) return absl::OkStatus();
    left_ = true;
    stopping_ = true;
  }
  cv_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
  absl::Status result;
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!fatal_status_.ok()) reason = fatal_status_.ToString();
    if (reason.empty() && !leave_reason_.ok()) reason = leave_reason_.ToString();
  }
  TruncateUtf8(&reason, 512);
  const std::vector<bool> lost = this->lost();
  using LeaveCall = PendingCall<v1::LeaveRequest, v1::LeaveResponse>;
  std::vector<std::pair<size_t, std::unique_ptr<LeaveCall>>> calls;  // all at once: one deadline in all
  for (size_t i = 0; i < stubs_.size(); ++i) {
    // Gone: a Leave would only wait for its deadline. (A Join that failed part way leaves the
    // session before `lost_` is sized: it leaves every aggregator it has a stub for.)
    if (i < lost.size() && lost[i]) continue;
    v1::LeaveRequest req;
    req.set_job_id(job_id_);
    req.set_rank(options_.rank);
    req.set_reason(reason);
    calls.emplace_back(i, std::make_unique<LeaveCall>(
                              [&](grpc::ClientContext* ctx, const v1::LeaveRequest* rq, v1::LeaveResponse* rs, auto cb) {
                                stubs_[i]->async()->Leave(ctx, rq, rs, std::move(cb));
                              },
                              std::move(req), options_.rpc_timeout));
  }
  for (auto& [i, call] : calls) {
    const grpc::Status& st = call->Wait();
    if (st.ok()) continue;
    const std::string where = absl::StrCat("leave at ", aggregators_[i].control);
    if (LeftAlready(st)) {
      // It no longer holds this worker, or is gone, and then forgets it at its heartbeat
      // deadline: what the Leave asked for is done either way, and failing here would fail a
      // job whose rounds have all ended.
      DLCP_LOG(Warning) << where << " failed, taken as left: " << st.error_message();
    } else if (result.ok()) {
      result = FromGrpcStatus(st, where);
    }
  }
  return result;
}

}  // namespace dlcp
