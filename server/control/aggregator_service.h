// The gRPC control service of dlcpd (callback API). Handlers run on gRPC's callback threads; they
// only touch the JobRegistry (its own locking) and read-only data-plane facts, so none blocks.
#pragma once

#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/metrics/registry.h"
#include "dlcp/v1/control.grpc.pb.h"
#include "common/rpc/grpc_peer.h"
#include "server/control/client_gate.h"
#include "server/control/drain_tracker.h"
#include "server/data/data_plane.h"
#include "server/jobs/job_registry.h"

namespace dlcp::server {

grpc::Status ToGrpcStatus(const absl::Status& s);

class AggregatorService final : public dlcp::v1::Aggregator::CallbackService {
 public:
  // `client_certificates`: under mutual TLS, the check every call passes first (ClientGate).
  AggregatorService(std::string aggregator_id, std::string advertise_host, JobRegistry* jobs, DataPlane* data,
                    MetricsRegistry* metrics, std::shared_ptr<const ClientCertificateVerifier> client_certificates = nullptr);
  // For ids that depend on the port gRPC picked, known only once the server runs.
  void set_aggregator_id(std::string id) {
    std::lock_guard<std::mutex> lock(id_mu_);
    id_ = std::move(id);
  }

  // Graceful shutdown: from Begin() on, joins are refused and heartbeats answered `draining`.
  DrainTracker& drain() { return drain_; }
  // What every call passes first; set its hooks before serving.
  ClientGate& gate() { return gate_; }

  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const v1::JoinRequest* req,
                                 v1::JoinResponse* resp) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx, const v1::LeaveRequest* req,
                                  v1::LeaveResponse* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx, const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) override;
  grpc::ServerUnaryReactor* GetTopology(grpc::CallbackServerContext* ctx, const v1::GetTopologyRequest* req,
                                        v1::Topology* resp) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* ctx, const v1::GetStatsRequest* req,
                                     v1::Stats* resp) override;
  // The coordinator's reply waits for every worker: it is the one handler that does not finish at
  // once (RegroupBarrier, bounded by the request's wait_ms).
  grpc::ServerUnaryReactor* Regroup(grpc::CallbackServerContext* ctx, const v1::RegroupRequest* req,
                                    v1::RegroupResponse* resp) override;
  grpc::ServerUnaryReactor* RotateDataKey(grpc::CallbackServerContext* ctx, const v1::RotateDataKeyRequest* req,
                                          v1::RotateDataKeyResponse* resp) override;

  // The handlers proper, behind the gRPC reactors above (and driven directly by the control-plane
  // fuzz target). `peer` is gRPC's peer string ("ipv4:10.0.0.7:51234").
  // `client`: who the caller is, for --max-jobs-per-client (ClientGate::Identity); empty: its address.
  absl::Status HandleJoin(const std::string& peer, const v1::JoinRequest& req, v1::JoinResponse* resp,
                          const std::string& client = "");
  // The worker's data plane must be this aggregator's: both UDP, or both RDMA with the same Q_Key.
  absl::Status CheckDataTransport(const v1::JoinRequest& req) const;
  // `client` (ClientGate::Identity) for the job-scoped calls: under mutual TLS only the job's owner's
  // identity is served (CheckJobOwner); empty: a caller with no identity.
  absl::Status HandleLeave(const v1::LeaveRequest& req, const std::string& client = "");
  // The job's rounds waiting here, and on whom (WaitingBoard), into a heartbeat answer.
  static void FillWaiting(Job& job, v1::HeartbeatResponse* resp);
  absl::Status HandleHeartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp,
                               const std::string& client = "");
  absl::Status HandleGetTopology(const v1::GetTopologyRequest& req, v1::Topology* resp, const std::string& client = "");
  absl::Status HandleGetStats(const v1::GetStatsRequest& req, v1::Stats* resp);
  static void FillRank(const Job& job, const RankLateness& r, v1::RankStats* out);
  // NotFound for a job not here; FailedPrecondition without data authentication.
  absl::Status HandleRotateDataKey(const v1::RotateDataKeyRequest& req, v1::RotateDataKeyResponse* resp);
  // Validates; then `done` gets the outcome, at once or when the coordination ends.
  absl::Status HandleRegroup(const v1::RegroupRequest& req, v1::RegroupResponse* resp,
                             std::function<void(absl::Status)> done, const std::string& client = "");

 private:
  void FillEndpoints(google::protobuf::RepeatedPtrField<v1::Endpoint>* out) const;
  // CheckJobOwner for job `job_id`, if it is here.
  absl::Status CheckCaller(uint32_t job_id, const std::string& client) const;
  // A job's keys as Join and Heartbeat hand them out to rank `rank`: the newest key its results
  // are signed with, the one before it while a rotation may still sign with it, and what the
  // rank signs with (left empty without per-worker keys).
  static void FillKeys(const KeyRing::Keys& keys, uint32_t rank, std::string* newest, std::string* previous,
                       std::string* worker);

  std::string id() const {
    std::lock_guard<std::mutex> lock(id_mu_);
    return id_;
  }

  mutable std::mutex id_mu_;
  std::string id_;
  const std::string advertise_host_;
  JobRegistry* jobs_;
  DataPlane* data_;
  MetricsRegistry* metrics_;
  const absl::Time started_;
  Counter* bad_requests_;
  ClientGate gate_;
  DrainTracker drain_;
};

}  // namespace dlcp::server
