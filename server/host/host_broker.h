// dlcpd's host socket (docs/host-stage.md): where the workers of a job on this host find each
// other and get their host stage. A worker connects, says its job, rank and how many of the job's
// workers run on this host (HostHello); once all of them are here, the broker creates the stage's
// shared region (a sealed memfd, within --host-shm-bytes over all stages) and hands it to each
// with its place (HostWelcome). Only processes of the user that came first get it (SO_PEERCRED).
//
// The connections stay open: when one closes, its worker is gone, and the broker marks it so in
// the region at once, so the others fail their ops naming its rank instead of waiting out a
// deadline. The region is released when its last member has gone.
//
// Threading: one thread of its own serves the socket; Start and the destructor from one thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/metrics/registry.h"

namespace dlcp::server {

struct HostBrokerOptions {
  std::string socket_path;                    // empty: no host socket
  uint64_t shm_bytes = uint64_t{1} << 30;     // --host-shm-bytes: every stage's region together
  uint64_t slot_bytes = uint64_t{16} << 20;   // --host-slot-bytes: each member's slot
  // How long the first worker of a stage waits for the others (--host-gather-timeout-ms); then
  // every one of them takes the network path.
  absl::Duration gather_timeout = absl::Seconds(30);
};

class HostBrokerLoop;

class HostBroker {
 public:
  // Listens on options.socket_path (mode 0666: access is checked per peer), replacing a socket
  // file no one serves; FAILED_PRECONDITION when another process serves it, or naming the error.
  static absl::StatusOr<std::unique_ptr<HostBroker>> Start(const HostBrokerOptions& options, MetricsRegistry* metrics);
  ~HostBroker();
  HostBroker(const HostBroker&) = delete;
  HostBroker& operator=(const HostBroker&) = delete;

 private:
  HostBroker() = default;
  std::unique_ptr<HostBrokerLoop> loop_;
  std::thread thread_;
  std::string path_;
  ino_t inode_ = 0;  // of the socket file it bound: a successor's file at the same path is left alone
};

}  // namespace dlcp::server
