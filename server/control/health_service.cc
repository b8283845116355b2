#include "server/control/health_service.h"

namespace dlcp::server {

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* ctx,
                                               const grpc::health::v1::HealthCheckRequest* req,
                                               grpc::health::v1::HealthCheckResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  if (!req->service().empty() && req->service() != "dlcp.v1.Aggregator") {
    reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service " + req->service()));
    return reactor;
  }
  resp->set_status(serving_.load() ? grpc::health::v1::HealthCheckResponse::SERVING
                                   : grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace dlcp::server
