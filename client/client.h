// dlcp::Client: the library a trainer links. Connect joins a job on every aggregator; AllReduce
// sums a float32 tensor across the job's workers and writes the sum back in place.
//
// Threading: every method may be called from any thread. AllReduce never blocks on the network:
// it validates, enqueues and returns a future, which the client's I/O thread completes. Each
// future completes by the op deadline at the latest. Nothing here aborts the host process; every
// failure is an absl::Status.
#pragma once

#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/security/tls.h"
#include "common/transport/transport.h"

namespace dlcp {

struct ClientOptions {
  // Control addresses (host:port) of the job's aggregators. Every worker must list the same set.
  std::vector<std::string> aggregators;
  std::string job_name = "default";
  uint32_t world_size = 1;
  uint32_t rank = 0;
  // Payload bytes per chunk (one datagram). 8192 fits a 9000-byte jumbo frame; use about 1400 on
  // a 1500-byte MTU. All workers of a job must agree.
  uint32_t chunk_bytes = 8192;
  TransportOptions transport;
  // gRPC security. TLS with the system's roots unless configured; plaintext must be chosen.
  TlsOptions tls;
  // The address aggregators send results to; empty means the address they see us calling from.
  std::string data_host;
  absl::Duration rpc_timeout = absl::Seconds(5);
  absl::Duration op_timeout = absl::Seconds(60);
  // Silence on an op for this long makes the client ask for what is missing.
  absl::Duration repair_timeout = absl::Milliseconds(20);
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Bytes pushed to one aggregator endpoint whose results have not come back yet (flow control).
  // Bounded so one worker's burst fits the aggregator's socket buffer.
  uint64_t window_bytes = 4 << 20;
  uint8_t data_class = 1;
};

struct RoundStats {
  uint32_t key = 0;
  uint32_t round = 0;
  absl::Duration time;
  uint64_t chunks = 0;
  uint64_t retransmits = 0;      // chunks pushed again after a NACK
  uint64_t result_requests = 0;  // times this worker asked for missing results
  uint32_t min_contributors = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
};

class TransferEngine;
class Session;

class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Sums `data` over all workers of the job, in place. `key` names the tensor; every worker
  // passes the same length for a key. One op per key at a time; `data` must stay valid and
  // untouched until the future is ready.
  std::future<absl::StatusOr<RoundStats>> AllReduce(uint32_t key, absl::Span<float> data);

  // Leaves the job on every aggregator and fails ops still pending. Idempotent.
  absl::Status Close();

  uint32_t rank() const;
  uint32_t world_size() const;
  uint32_t job_id() const;

 private:
  Client() = default;
  ClientOptions options_;
  std::unique_ptr<Session> session_;
  std::unique_ptr<TransferEngine> engine_;
};

}  // namespace dlcp
