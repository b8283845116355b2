#include "server/control/aggregator_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "common/base/build_config.h"
#include "common/base/clock.h"
#include "common/base/host_port.h"
#include "common/base/log.h"
#include "common/wire/header.h"
#include "common/wire/version_check.h"
#include "common/transport/transport_options.h"

namespace dlcp::server {

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  // absl and gRPC number their codes identically.
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

namespace {
// The joining worker as it describes itself (Roster), its fields bounded: they go into errors
// and are kept for the job's life.
absl::StatusOr<Joiner> JoinerOf(const v1::JoinRequest& req, const std::string& peer) {
  constexpr size_t kMaxHost = 255, kMaxAggregators = 1024, kMaxAggregator = 300;
  if (req.client_host().size() > kMaxHost) {
    return absl::InvalidArgumentError(
        absl::StrCat("client_host is ", req.client_host().size(), " bytes; at most ", kMaxHost));
  }
  if (static_cast<size_t>(req.aggregators_size()) > kMaxAggregators) {
    return absl::InvalidArgumentError(
        absl::StrCat("aggregators lists ", req.aggregators_size(), "; at most ", kMaxAggregators));
  }
  Joiner j;
  for (const std::string& a : req.aggregators()) {
    if (a.empty() || a.size() > kMaxAggregator) {
      return absl::InvalidArgumentError(
          absl::StrCat("an entry of aggregators is ", a.size(), " bytes; 1 to ", kMaxAggregator));
    }
    j.aggregators.push_back(a);
  }
  j.incarnation = req.incarnation();
  const std::string host = req.client_host().empty() ? PeerHost(peer) : req.client_host();
  j.host = host;
  j.who = req.client_pid() != 0 ? absl::StrCat("host ", host, " pid ", req.client_pid()) : absl::StrCat("host ", host);
  return j;
}
}  // namespace

AggregatorService::AggregatorService(std::string aggregator_id, std::string advertise_host, JobRegistry* jobs,
                                     DataPlane* data, MetricsRegistry* metrics,
                                     std::shared_ptr<const ClientCertificateVerifier> client_certificates)
    : id_(std::move(aggregator_id)),
      advertise_host_(std::move(advertise_host)),
      jobs_(jobs),
      data_(data),
      metrics_(metrics),
      started_(MonotonicNow()),
      bad_requests_(metrics->GetCounter("dlcp_control_rejected_requests_total", {}, "Control RPCs refused")),
      gate_(std::move(client_certificates), metrics) {
  // The usual build_info gauge: dashboards join it on the instance to see a fleet's releases.
  metrics->AddComputed("dlcp_build_info",
                       {{"version", DLCP_VERSION}, {"wire_version", absl::StrCat(static_cast<uint32_t>(wire::kVersion))}},
                       MetricsRegistry::Kind::kGauge, "This dlcpd's release and data-plane wire format (always 1)",
                       [] { return 1.0; });
}

void AggregatorService::FillEndpoints(google::protobuf::RepeatedPtrField<v1::Endpoint>* out) const {
  const std::vector<std::vector<Address>> spray = data_->spray_sources();
  const std::vector<Address> endpoints = data_->endpoints();
  for (size_t i = 0; i < endpoints.size(); ++i) {
    const Address& a = endpoints[i];
    v1::Endpoint* e = out->Add();
    for (const Address& s : spray[i]) {
      if (s.qpn != 0) {
        e->add_spray_qpns(s.qpn);
      } else {
        e->add_spray_ports(s.port);
      }
    }
    if (a.qpn != 0) {
      // An RDMA peer is addressed by the GID's IPv4 address, whatever host the client dialled.
      e->set_host(a.HostString());
      e->set_qpn(a.qpn);
      e->set_qkey(data_->rdma_qkey());
    } else {
      e->set_host(advertise_host_);  // empty: the client uses the host it dialled
      e->set_port(a.port);
    }
  }
}

absl::Status AggregatorService::CheckDataTransport(const v1::JoinRequest& req) const {
  const bool rdma = data_->kind() == TransportOptions::Kind::kRdma;
  if (rdma != (req.data_qpn() != 0)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "aggregator ", id(), " serves data over ", rdma ? "RDMA" : "UDP", " but the worker joined with ",
        rdma ? "UDP" : "RDMA", ": use the same --transport on workers and aggregators (auto picks RDMA wherever a "
        "device is usable)"));
  }
  if (rdma) {
    if (req.data_qpn() > 0xffffff) {
      return absl::InvalidArgumentError(absl::StrCat("data_qpn ", req.data_qpn(), " is over 24 bits"));
    }
    if (req.data_qkey() != data_->rdma_qkey()) {
      return absl::FailedPreconditionError(absl::StrCat("the worker's RDMA Q_Key 0x", absl::Hex(req.data_qkey()),
                                                        " is not this aggregator's 0x", absl::Hex(data_->rdma_qkey()),
                                                        ": set the same --rdma-qkey everywhere"));
    }
  } else if (req.data_port() == 0 || req.data_port() > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("data_port ", req.data_port(), " outside [1, 65535]"));
  }
  return absl::OkStatus();
}

absl::Status AggregatorService::CheckCaller(uint32_t job_id, const std::string& client) const {
  std::shared_ptr<Job> job = jobs_->Find(job_id);
  return job ? CheckJobOwner(*job, client) : absl::OkStatus();  // an unknown job is the handler's to answer
}

absl::Status AggregatorService::HandleJoin(const std::string& peer, const v1::JoinRequest& req,
                                           v1::JoinResponse* resp, const std::string& client) {
  if (drain_.active()) {
    if (std::shared_ptr<Job> job = jobs_->Find(JobIdForName(req.job_name()));
        job && job->name == req.job_name() && req.rank() < job->world && job->members[req.rank()].joined()) {
      drain_.LetGo(job->id, req.rank());  // a member probing: it has moved off this aggregator
    }
    // UNAVAILABLE, like an aggregator that is not there: a worker probing a lost aggregator keeps
    // it lost, and a restart at this address is joined again once it serves.
    return absl::UnavailableError(absl::StrCat("aggregator ", id(), " is shutting down and takes no new members"));
  }
  constexpr size_t kMaxClientVersionBytes = 64;  // a release name, quoted in errors and logs
  if (req.client_version().size() > kMaxClientVersionBytes) {
    return absl::InvalidArgumentError(absl::StrCat("client_version is ", req.client_version().size(),
                                                   " bytes; at most ", kMaxClientVersionBytes));
  }
  if (absl::Status s = wire::CheckPeerWireVersion(req.wire_version(), req.client_version(), "the worker",
                                                  absl::StrCat("aggregator ", id()));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckDataTransport(req); !s.ok()) return s;
  if (jobs_->limits().data_auth && jobs_->limits().per_worker_data_keys && !req.worker_keys()) {
    return absl::FailedPreconditionError(
        "this aggregator gives each worker a data key of its own rank, and this client predates them (it would sign "
        "with the job's shared key and every packet would be refused): upgrade it, or run dlcpd with "
        "--per-worker-data-keys=false");
  }
  std::string host = req.data_host().empty() ? PeerHost(peer) : req.data_host();
  if (host.empty()) return absl::InvalidArgumentError(absl::StrCat("no data_host given and peer '", peer, "' is not IP"));
  absl::StatusOr<Address> addr = ResolveAddress(host, static_cast<uint16_t>(req.data_port()), data_->family());
  if (!addr.ok()) return addr.status();
  addr->qpn = req.data_qpn();
  absl::StatusOr<Joiner> joiner = JoinerOf(req, peer);
  if (!joiner.ok()) return joiner.status();
  JoinSpec spec{req.job_name(), req.world_size(), req.rank(), req.chunk_bytes(), *addr, std::move(*joiner),
                client.empty() ? absl::StrCat("address ", PeerHost(peer)) : client};
  if (req.host_group_size() > static_cast<int>(kMaxHostGroup)) {
    return absl::InvalidArgumentError(absl::StrCat("host_group has more than ", kMaxHostGroup, " ranks"));
  }
  spec.host_group.assign(req.host_group().begin(), req.host_group().end());
  absl::StatusOr<std::shared_ptr<Job>> job = jobs_->Join(spec);
  if (!job.ok()) return job.status();
  resp->set_job_id((*job)->id);
  const auto [epoch, rejoins] = (*job)->EpochForJoiner();
  resp->set_epoch(epoch);
  resp->set_rejoins(rejoins);
  // A round holds a slot on every data thread its chunks reach, and lingers until the slowest
  // worker confirms it, while faster workers start new ones: tell clients a share that cannot
  // overrun the aggregator's limit.
  const uint32_t threads = static_cast<uint32_t>(data_->endpoints().size());
  resp->set_max_rounds_in_flight(std::max<uint32_t>(1, jobs_->limits().max_rounds_in_flight / (2 * threads)));
  resp->set_aggregator_id(id());
  resp->set_wire_version(wire::kVersion);
  resp->set_aggregator_version(DLCP_VERSION);
  if (const KeyRing::Keys* keys = (*job)->keys()) {
    // The joiner signs with the newest key from now on.
    (*job)->ring->Holds(req.rank(), keys->generation);
    FillKeys(*keys, req.rank(), resp->mutable_data_key(), resp->mutable_previous_data_key(),
             resp->mutable_worker_key());
    resp->set_data_key_generation(keys->generation);
  }
  resp->set_heartbeat_timeout_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(jobs_->limits().heartbeat_timeout)));
  FillEndpoints(resp->mutable_data_endpoints());
  return absl::OkStatus();
}

void AggregatorService::FillKeys(const KeyRing::Keys& keys, uint32_t rank, std::string* newest, std::string* previous,
                                 std::string* worker) {
  const auto fill = [](const wire::MacKey& key, std::string* out) {
    const std::array<uint8_t, 32> b = wire::MacKeyToBytes(key);
    out->assign(b.begin(), b.end());
  };
  if (const wire::MacKey* results = keys.newest->result(rank)) fill(*results, newest);
  if (keys.previous) {
    if (const wire::MacKey* results = keys.previous->result(rank)) fill(*results, previous);
  }
  // Without per-worker keys the member signs with data_key, as clients from before expect.
  if (!keys.newest->workers.empty()) {
    if (const wire::MacKey* mine = keys.newest->worker(rank)) fill(*mine, worker);
  }
}

// Every call passes the gate first: under mutual TLS the identity the handlers read
// (ClientGate::Identity) is one the CA vouches for.
#define DLCP_UNARY(ctx, expr)                            \
  auto* reactor = (ctx)->DefaultReactor();               \
  absl::Status status = gate_.Admit(*(ctx), __func__);   \
  if (status.ok()) status = (expr);                      \
  if (!status.ok()) bad_requests_->Add();                \
  reactor->Finish(ToGrpcStatus(status));                 \
  return reactor

grpc::ServerUnaryReactor* AggregatorService::Join(grpc::CallbackServerContext* ctx, const v1::JoinRequest* req,
                                                  v1::JoinResponse* resp) {
  DLCP_UNARY(ctx, HandleJoin(ctx->peer(), *req, resp, gate_.Identity(*ctx)));
}

grpc::ServerUnaryReactor* AggregatorService::RotateDataKey(grpc::CallbackServerContext* ctx,
                                                           const v1::RotateDataKeyRequest* req,
                                                           v1::RotateDataKeyResponse* resp) {
  DLCP_UNARY(ctx, HandleRotateDataKey(*req, resp));
}

absl::Status AggregatorService::HandleRotateDataKey(const v1::RotateDataKeyRequest& req,
                                                    v1::RotateDataKeyResponse* resp) {
  if (req.job_name().empty() || req.job_name().size() > 256) {
    return absl::InvalidArgumentError("job_name must be 1 to 256 bytes");
  }
  std::shared_ptr<Job> job = jobs_->Find(JobIdForName(req.job_name()));
  if (!job || job->name != req.job_name()) {
    return absl::NotFoundError(absl::StrCat("no job '", req.job_name(), "' at this aggregator"));
  }
  absl::StatusOr<bool> started = jobs_->RotateKey(job->id, MonotonicNow());
  if (!started.ok()) return started.status();
  if (*started) DLCP_LOG(Info) << "job " << job->name << ": data key " << job->keys()->generation << " drawn on request";
  resp->set_started(*started);
  resp->set_data_key_generation(job->keys()->generation);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* AggregatorService::Leave(grpc::CallbackServerContext* ctx, const v1::LeaveRequest* req,
                                                   v1::LeaveResponse* resp) {
  DLCP_UNARY(ctx, HandleLeave(*req, gate_.Identity(*ctx)));
}

grpc::ServerUnaryReactor* AggregatorService::Heartbeat(grpc::CallbackServerContext* ctx,
                                                       const v1::HeartbeatRequest* req,
                                                       v1::HeartbeatResponse* resp) {
  DLCP_UNARY(ctx, HandleHeartbeat(*req, resp, gate_.Identity(*ctx)));
}

grpc::ServerUnaryReactor* AggregatorService::GetTopology(grpc::CallbackServerContext* ctx,
                                                         const v1::GetTopologyRequest* req, v1::Topology* resp) {
  DLCP_UNARY(ctx, HandleGetTopology(*req, resp, gate_.Identity(*ctx)));
}

absl::Status AggregatorService::HandleGetTopology(const v1::GetTopologyRequest& req, v1::Topology* resp,
                                                  const std::string& client) {
  std::shared_ptr<Job> job = jobs_->Find(req.job_id());
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", req.job_id(), " at aggregator ", id()));
  if (absl::Status s = CheckJobOwner(*job, client); !s.ok()) return s;
  resp->set_aggregator_id(id());
  resp->set_epoch(job->epoch.load());
  resp->set_world_size(job->world);
  FillEndpoints(resp->mutable_data_endpoints());
  const int64_t now = MonotonicNanos();
  for (uint32_t r = 0; r < job->world; ++r) {
    const Member& m = job->members[r];
    if (!m.joined()) continue;
    v1::Member* out = resp->add_members();
    out->set_rank(r);
    Address a = m.address();
    out->mutable_data()->set_host(a.HostString());
    out->mutable_data()->set_port(a.port);
    out->mutable_data()->set_qpn(a.qpn);
    out->set_last_heartbeat_ms_ago((now - m.last_heartbeat_ns.load()) / 1000000);
  }
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* AggregatorService::GetStats(grpc::CallbackServerContext* ctx, const v1::GetStatsRequest* req,
                                                      v1::Stats* resp) {
  DLCP_UNARY(ctx, HandleGetStats(*req, resp));
}

absl::Status AggregatorService::HandleLeave(const v1::LeaveRequest& req, const std::string& client) {
  if (absl::Status s = CheckCaller(req.job_id(), client); !s.ok()) return s;
  if (req.reason().size() > 512) {
    return absl::InvalidArgumentError(absl::StrCat("leave reason of ", req.reason().size(), " bytes exceeds 512"));
  }
  return jobs_->Leave(req.job_id(), req.rank(), req.reason());
}

void AggregatorService::FillWaiting(Job& job, v1::HeartbeatResponse* resp) {
  constexpr size_t kMaxRanks = 64;
  // Noted about once a second while a round waits: two seconds old is stale.
  for (const WaitingRound& w : job.waiting.Fresh(MonotonicNanos(), absl::ToInt64Nanoseconds(absl::Seconds(2)))) {
    v1::WaitingRound* out = resp->add_waiting();
    out->set_key(w.key);
    out->set_round(w.round);
    for (size_t i = 0; i < w.silent_ranks.size() && i < kMaxRanks; ++i) out->add_silent_ranks(w.silent_ranks[i]);
    out->set_waited_ms(static_cast<uint32_t>(std::min<int64_t>(w.waited_ns / 1000000, UINT32_MAX)));
  }
}

namespace {
// A host stage's view of its members, from a heartbeat of the rank that leads it: only ranks of its
// group, and only from that rank. False: refused (counted).
bool NoteStageReport(Job& job, const v1::HeartbeatRequest& req) {
  constexpr int kMaxMembers = 64;  // kMaxStageMembers
  if (req.stage_members_size() == 0) return true;
  std::shared_ptr<const std::vector<uint32_t>> group = job.HostGroupLedBy(req.rank());
  if (group == nullptr || req.stage_members_size() > kMaxMembers) return false;
  std::vector<RankLateness> members;
  for (const v1::RankStats& m : req.stage_members()) {
    if (!std::binary_search(group->begin(), group->end(), m.rank())) return false;
    members.push_back(RankLateness{.rank = m.rank(), .rounds = m.rounds(), .mean_us = m.mean_lateness_us(),
                                   .p50_us = m.p50_lateness_us(), .p99_us = m.p99_lateness_us(), .last = m.last(),
                                   .ahead_us = m.ahead_of_last_us()});
  }
  job.stragglers.NoteStage(req.rank(), std::move(members), MonotonicNanos());
  return true;
}
}  // namespace

absl::Status AggregatorService::HandleHeartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp,
                                                const std::string& client) {
  if (absl::Status s = CheckCaller(req.job_id(), client); !s.ok()) return s;
  absl::Status s = jobs_->Heartbeat(req.job_id(), req.rank(), req.data_key_generation(), req.incarnation());
  if (std::shared_ptr<Job> job = jobs_->Find(req.job_id()); job && s.ok() && !NoteStageReport(*job, req)) {
    bad_requests_->Add();  // only the report is refused: a worker is not dropped over it
  }
  if (std::shared_ptr<Job> job = jobs_->Find(req.job_id())) {
    resp->set_epoch(job->epoch.load());
    resp->set_rejoins(job->rejoins.load());
    // After the heartbeat, which may have moved a rotation on: the member learns the new phase at once.
    if (const KeyRing::Keys* keys = job->keys(); keys != nullptr && s.ok()) {
      FillKeys(*keys, req.rank(), resp->mutable_data_key(), resp->mutable_previous_data_key(),
               resp->mutable_worker_key());
      resp->set_data_key_generation(keys->generation);
    }
    if (s.ok() && job->failed.load()) resp->set_job_failure(job->failure_reason());
    if (s.ok()) {
      FillWaiting(*job, resp);
      const std::vector<RankLateness> slowest = job->stragglers.Ranks(MonotonicNanos(), 1);
      if (!slowest.empty()) FillRank(*job, slowest.front(), resp->mutable_slowest());
    }
  }
  if (s.ok() && drain_.active()) {
    resp->set_draining(true);
    drain_.Told(req.job_id(), req.rank());
  }
  return s;
}

grpc::ServerUnaryReactor* AggregatorService::Regroup(grpc::CallbackServerContext* ctx, const v1::RegroupRequest* req,
                                                     v1::RegroupResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  absl::Status status = gate_.Admit(*ctx, __func__);
  if (status.ok()) {
    status = HandleRegroup(*req, resp, [this, reactor](absl::Status s) {
      if (!s.ok()) bad_requests_->Add();
      reactor->Finish(ToGrpcStatus(s));
    }, gate_.Identity(*ctx));
  }
  if (!status.ok()) {
    bad_requests_->Add();
    reactor->Finish(ToGrpcStatus(status));
  }
  return reactor;
}

absl::Status AggregatorService::HandleRegroup(const v1::RegroupRequest& req, v1::RegroupResponse* resp,
                                              std::function<void(absl::Status)> done, const std::string& client) {
  if (absl::Status s = CheckCaller(req.job_id(), client); !s.ok()) return s;
  constexpr int kMaxLost = 64;
  constexpr int kMaxKeys = 1 << 16;
  constexpr uint32_t kMaxWaitMs = 120000;
  if (req.generation() == 0) return absl::InvalidArgumentError("regroup generation must be at least 1");
  // None lost: every aggregator is back.
  if (req.lost_size() > kMaxLost) {
    return absl::InvalidArgumentError(absl::StrCat("regroup names over ", kMaxLost, " lost aggregators"));
  }
  for (const std::string& l : req.lost()) {
    if (l.empty() || l.size() > 256) return absl::InvalidArgumentError("a lost aggregator's address is empty or over 256 bytes");
  }
  if (req.keys_size() > kMaxKeys) {
    return absl::InvalidArgumentError(absl::StrCat("regroup reports ", req.keys_size(), " keys, over ", kMaxKeys));
  }
  if (req.coordinate() && (req.wait_ms() == 0 || req.wait_ms() > kMaxWaitMs)) {
    return absl::InvalidArgumentError(absl::StrCat("regroup wait_ms ", req.wait_ms(), " is not in [1, ", kMaxWaitMs, "]"));
  }
  RegroupArrival a;
  a.rank = req.rank();
  a.generation = req.generation();
  a.lost.assign(req.lost().begin(), req.lost().end());
  std::sort(a.lost.begin(), a.lost.end());
  a.coordinate = req.coordinate();
  for (const v1::KeyRounds& k : req.keys()) a.done.emplace_back(k.key(), k.done());
  a.deadline = MonotonicNow() + absl::Milliseconds(req.wait_ms());
  return jobs_->Regroup(req.job_id(), std::move(a),
                        [resp, done = std::move(done)](absl::StatusOr<RegroupOutcome> outcome) {
                          if (!outcome.ok()) return done(outcome.status());
                          resp->set_epoch(outcome->epoch);
                          for (const KeySpan& s : outcome->spans) {
                            v1::KeyRounds* k = resp->add_keys();
                            k->set_key(s.key);
                            k->set_done(s.min);
                            k->set_done_max(s.max);
                          }
                          done(absl::OkStatus());
                        });
}

void AggregatorService::FillRank(const Job& job, const RankLateness& r, v1::RankStats* out) {
  out->set_rank(r.rank);
  out->set_host(job.roster.HostOf(r.rank));
  out->set_rounds(r.rounds);
  out->set_mean_lateness_us(r.mean_us);
  out->set_p50_lateness_us(r.p50_us);
  out->set_p99_lateness_us(r.p99_us);
  out->set_last(r.last);
  out->set_nacked_chunks(r.nacked);
  out->set_repaired_chunks(r.repaired);
  out->set_ahead_of_last_us(r.ahead_us);
}

absl::Status AggregatorService::HandleGetStats(const v1::GetStatsRequest& req, v1::Stats* resp) {
  resp->set_aggregator_id(id());
  resp->set_uptime_ms(absl::ToInt64Milliseconds(MonotonicNow() - started_));
  resp->set_version(DLCP_VERSION);
  resp->set_wire_version(wire::kVersion);
  resp->set_draining(drain_.active());
  for (const std::shared_ptr<Job>& job : jobs_->List()) {
    v1::JobStats* js = resp->add_jobs();
    js->set_job_id(job->id);
    js->set_job_name(job->name);
    js->set_owner(job->creator);
    js->set_world_size(job->world);
    js->set_members(job->member_count.load());
    js->set_rounds_completed(job->rounds_completed.load());
    js->set_rounds_in_flight(job->rounds_in_flight.load());
    if (const KeyRing::Keys* keys = job->keys()) js->set_data_key_generation(keys->generation);
    if (req.ranks()) {
      for (const RankLateness& r : job->stragglers.Ranks(MonotonicNanos())) FillRank(*job, r, js->add_ranks());
    }
  }
  for (const auto& [name, value] : metrics_->Snapshot()) (*resp->mutable_counters())[name] = value;
  return absl::OkStatus();
}

}  // namespace dlcp::server
