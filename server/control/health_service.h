// grpc.health.v1 for dlcpd's plaintext probe port (kubelet's gRPC probes cannot use TLS). The
// control port has gRPC's default health service; this one answers Check for the whole server
// ("") and for dlcp.v1.Aggregator, from a flag the daemon flips to NOT_SERVING on shutdown.
// Handlers run on gRPC callback threads and never block.
#pragma once

#include <atomic>

#include "grpc/health/v1/health.grpc.pb.h"

namespace dlcp::server {

class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  void set_serving(bool serving) { serving_.store(serving); }

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* ctx, const grpc::health::v1::HealthCheckRequest* req,
                                  grpc::health::v1::HealthCheckResponse* resp) override;

 private:
  std::atomic<bool> serving_{true};
};

}  // namespace dlcp::server
