// dlcpd's data plane: N data threads, each owning one transport endpoint and the rounds whose
// chunks clients send to that endpoint, so the hot path takes no locks. A thread blocks in
// Receive with a short timeout that doubles as its timer tick (repair, probes, expiry).
#pragma once

#include <memory>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics/registry.h"
#include "common/faults/drop_injector.h"
#include "common/transport/transport.h"
#include "common/transport/transport_options.h"
#include "server/jobs/job_registry.h"

namespace dlcp::server {

struct DataPlaneOptions {
  TransportOptions transport;  // a nonzero port gives thread i port + i
  uint32_t threads = 1;
  absl::Duration tick = absl::Milliseconds(5);
  // Silence on a round for this long triggers NACKs (missing pushes) or probes (missing acks).
  absl::Duration repair_timeout = absl::Milliseconds(5);
  // A round not finished after this long is dropped, so a vanished worker cannot pin memory.
  absl::Duration round_timeout = absl::Seconds(120);
  // Fraction of received pushes and of sent results to discard, for tests of the repair path.
  double inject_drop = 0.0;
  uint64_t inject_seed = 1;
  // Per-class drops of received packets and sent results, in bursts (each thread seeds it with
  // seed + its index).
  DropInjectorOptions inject_class;
  // Share results to each worker over the spray paths by each path's loss rate, learnt from the
  // results the worker asks for again (common/datapath/path_shares.h); off: equal turns.
  bool result_steering = true;
  // Accumulator blocks each data thread keeps for reuse once their rounds end; beyond this,
  // ended rounds' memory is freed.
  size_t block_cache_bytes = size_t{256} << 20;
};

class DataThread;

class DataPlane {
 public:
  // Also registers the transports' counters in `metrics`, which must outlive the plane's use.
  static absl::StatusOr<std::unique_ptr<DataPlane>> Create(const DataPlaneOptions& options, JobRegistry* jobs,
                                                           MetricsRegistry* metrics);
  ~DataPlane();

  // One per data thread; clients spread chunks over them.
  std::vector<Address> endpoints() const;
  // What the endpoints are (kUdp or kRdma; kAuto was resolved when they were made), and for
  // RDMA the Q_Key their queue pairs accept. Clients must match both.
  TransportOptions::Kind kind() const { return kind_; }
  // Transport::where of the first data thread's (every thread's is on the same device and port).
  std::map<std::string, std::string> where() const;
  // AF_INET or AF_INET6: the endpoints' address family, which every worker's must share.
  int family() const;
  // Per endpoint, the other sources it sprays its datagrams from (UDP ports, RDMA queue pairs).
  std::vector<std::vector<Address>> spray_sources() const;
  uint32_t rdma_qkey() const { return rdma_qkey_; }
  // Stops and joins the threads. Idempotent.
  void Stop();

 private:
  DataPlane() = default;
  std::vector<std::unique_ptr<DataThread>> threads_;
  std::vector<std::thread> running_;
  TransportOptions::Kind kind_ = TransportOptions::Kind::kUdp;
  uint32_t rdma_qkey_ = 0;
};

}  // namespace dlcp::server
