// dlcpd's settings: declared once in the registry, then turned into typed options with every
// cross-field check done before anything starts.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/base/log.h"
#include "common/config/registry.h"
#include "server/control/connection_limits.h"
#include "common/security/tls.h"
#include "server/data/data_plane.h"
#include "server/host/host_broker.h"
#include "server/jobs/job_registry.h"

namespace dlcp::server {

// What one client may hold of the gRPC ports (control and health): connections, calls and
// memory, and how long a connection may sit in its handshake or idle.
struct ControlLimits {
  ConnectionLimits connections;
  absl::Duration handshake_timeout = absl::Seconds(10);
  absl::Duration idle_timeout = absl::Minutes(5);
  uint32_t max_streams = 64;  // concurrent calls per connection
  int64_t memory_bytes = int64_t{256} << 20;
};

struct DlcpdOptions {
  std::string host;
  uint16_t control_port = 0;
  std::string advertise_host;
  std::string aggregator_id;
  std::string ready_file;
  int metrics_port = -1;  // -1: off
  std::string metrics_host;  // --metrics-host, or --host
  uint32_t metrics_slowest_ranks = 3;  // per job, in the straggler metrics
  int health_port = -1;   // -1: off
  absl::Duration job_idle_timeout;
  absl::Duration drain_timeout;  // zero: SIGTERM stops at once
  DataPlaneOptions data;
  JobLimits limits;
  ControlLimits control;
  LogOptions log;
  TlsOptions tls;
  // --job-owner-pattern: a regular expression (RE2) with one capture group, or empty
  // (ClientGate::set_owner_pattern).
  std::string job_owner_pattern;
  HostBrokerOptions host_stage;
  // --host-socket was the default: a host where it cannot be served (not root, another dlcpd
  // there) runs without host stages, with a warning, rather than refusing to start.
  bool host_socket_defaulted = true;
};

inline constexpr char kDefaultHostSocket[] = "/run/dlcp/dlcpd.sock";

void DeclareDlcpdFlags(ConfigRegistry* config);
absl::StatusOr<DlcpdOptions> DlcpdOptionsFromConfig(const ConfigRegistry& config);


}  // namespace dlcp::server
