// dlcpctl doctor: checks this host for dlcp. Each check gives ok, warn or fail, with what it found
// and the fix: RDMA devices and their ports, the RoCEv2 GID dlcp would pick, the network
// interface's MTU against the one RoCE derives from it, the locked-memory limit against what an
// RDMA endpoint registers, the UDP buffer limits, DSCP trust advice, the host stage through this
// host's dlcpd, and each aggregator reached by a real round trip (a Join, a one-element all-reduce
// over its data port, a Leave).
#pragma once

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/client.h"

namespace dlcp::ctl {

struct Finding {
  enum class Level { kOk, kWarn, kFail };
  Level level = Level::kOk;
  std::string check;   // what was checked: "rdma port rxe0/1"
  std::string detail;  // what was found, and for warn and fail the fix
};

struct DoctorOptions {
  std::string sysfs = "/sys";    // tests point these at trees of their own
  std::string procfs = "/proc";
  std::vector<std::string> aggregators;  // probed in turn; none: the host checks only
  ClientOptions probe;           // TLS, transport, deadlines of the probes
  size_t socket_buffer_bytes = 32 << 20;  // what dlcpd asks for (--socket-buffer-bytes)
  uint32_t data_threads = 1;     // RDMA endpoints per dlcpd, for the memlock need
  std::string host_socket;       // this host's dlcpd's --host-socket; empty: not checked
};

// The host checks (no network).
std::vector<Finding> CheckHost(const DoctorOptions& o);
// One finding per aggregator.
std::vector<Finding> ProbeAggregators(const DoctorOptions& o);
// Whether this host's workers can share a host stage: a job of two workers of its own asks dlcpd
// over `host_socket` as workers do, and the region dlcpd hands each is mapped and seen the same by
// both. One finding; none when host_socket is empty.
std::vector<Finding> ProbeHostStage(const DoctorOptions& o);

// "ok    check: detail" lines; and whether any is fail.
std::string FormatFindings(const std::vector<Finding>& findings);
std::string FindingsJson(const std::vector<Finding>& findings);
bool AnyFailed(const std::vector<Finding>& findings);

}  // namespace dlcp::ctl
