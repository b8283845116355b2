// A TCP port whose connections a gRPC server serves, accepted here rather than by gRPC so that
// each is held to ConnectionLimits before gRPC sees it. The port is bound exclusively (no
// SO_REUSEPORT: a second dlcpd must not share it) and marked with a DSCP that accepted
// connections inherit. One thread of its own accepts; a refused connection is closed at once.
#pragma once

#include <grpcpp/server_builder.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "server/control/connection_limits.h"

namespace dlcp::server {

// Why a bind to `port` failed with `err`: "port 7400 is in use (...)", or the system's reason.
std::string BindProblem(int port, int err);

class LimitedListener {
 public:
  // Binds host:port (0: a free one) and listens. UNAVAILABLE says why (BindProblem).
  // `limiter` must outlive the listener.
  static absl::StatusOr<std::unique_ptr<LimitedListener>> Bind(const std::string& host, uint16_t port, uint8_t dscp,
                                                               ConnectionLimiter* limiter);
  ~LimitedListener();
  LimitedListener(const LimitedListener&) = delete;
  LimitedListener& operator=(const LimitedListener&) = delete;

  uint16_t port() const { return port_; }
  // Registers the port with `builder` (before BuildAndStart) under `credentials`. Call once.
  void ServeWith(grpc::ServerBuilder* builder, const std::shared_ptr<grpc::ServerCredentials>& credentials);
  // Once the server has started (gRPC closes what it is handed before): accepts, and hands it each
  // admitted connection. Until then connections wait in the backlog. Call once.
  void Start();
  // Stops accepting and closes the port; returns once the accept thread has ended (within
  // 100 ms). Idempotent.
  void Stop();

 private:
  LimitedListener(int fd, uint16_t port, ConnectionLimiter* limiter) : fd_(fd), port_(port), limiter_(limiter) {}
  void AcceptLoop();

  int fd_;
  uint16_t port_;
  ConnectionLimiter* limiter_;
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace dlcp::server
