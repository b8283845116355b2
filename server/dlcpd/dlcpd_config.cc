#include "server/dlcpd/dlcpd_config.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "re2/re2.h"
#include "common/security/tls_flags.h"
#include "common/shm/stage_layout.h"
#include "common/transport/transport_flags.h"
#include "common/transport/transport_options.h"

namespace dlcp::server {

namespace {

// Where dlcpd serves: its ports and what it announces.
void DeclareServingFlags(ConfigRegistry* c) {
  c->AddString("host", "0.0.0.0", "address to bind the control (gRPC) and data ports to");
  c->AddInt("port", 7400, 0, 65535, "gRPC control port (0 picks a free one)");
  c->AddInt("data-port", 7401, 0, 65535, "first UDP data port; data thread i uses data-port + i (0 picks free ones)");
  c->AddInt("data-threads", 1, 1, 64, "data threads, each with its own data port and share of the rounds");
  c->AddString("advertise-host", "", "host clients should send data to; empty means the host they dialled");
  c->AddString("id", "", "aggregator id reported in stats; empty means host:port");
  c->AddInt("health-port", -1, -1, 65535,
            "plaintext gRPC port serving only grpc.health.v1, for kubelet probes (they cannot use TLS); -1 disables it");
  c->AddInt("metrics-port", -1, -1, 65535,
            "Prometheus /metrics port on --metrics-host; -1 disables it, 0 picks a free one");
  c->AddString("metrics-host", "", "address to serve /metrics on, IPv4 only (the HTTP server has no IPv6); empty: --host");
  c->AddInt("metrics-slowest-ranks", 3, 0, 64,
            "per job, how many of its latest ranks dlcp_rank_lateness_seconds and dlcp_rank_last_ratio name");
  c->AddString("ready-file", "", "write {\"control_port\":..,\"data_ports\":[..]} here once serving");
}

// The data threads' timing, and the drops they inject for tests.
void DeclareRoundFlags(ConfigRegistry* c) {
  c->AddInt("tick-ms", 5, 1, 1000, "data thread timer tick, also the longest receive wait");
  c->AddInt("repair-timeout-ms", 5, 1, 60000, "silence on a round before missing chunks are NACKed");
  c->AddInt("round-timeout-ms", 120000, 100, 3600000, "an unfinished round is dropped after this long");
  c->AddDouble("inject-drop", 0.0, 0.0, 0.9, "fraction of received pushes and sent results to discard (tests)");
  c->AddInt("inject-seed", 1, 0, INT64_MAX, "seed for --inject-drop and --inject-drop-class");
  c->AddString("inject-drop-class", "", "per-class drops of received packets and sent results, C:P[,C:P] (tests)",
               [](const std::string& v) {
                 std::array<double, wire::kNumClasses> unused{};
                 return ParseClassDrops(v, &unused);
               });
  c->AddInt("inject-burst", 1, 1, 1000, "packets per --inject-drop-class drop event (microbursts)");
}

// How long a job and its workers may be silent, and how many jobs there are.
void DeclareJobFlags(ConfigRegistry* c) {
  c->AddInt("heartbeat-timeout-ms", 3000, 100, 600000,
            "a worker silent this long is removed and its job fails, telling the other workers why");
  c->AddInt("drain-timeout-ms", 5000, 0, 600000,
            "on SIGTERM, keep serving this long at most while heartbeat answers tell every worker this aggregator "
            "is going away (docs/failure-modes.md, \"Draining\"); 0: stop at once");
  c->AddInt("job-idle-timeout-ms", 60000, 1000, 86400000,
            "a job with no heartbeat from any member for this long is removed");
  c->AddInt("max-jobs", 64, 1, 100000, "jobs this aggregator serves at once");
  c->AddInt("max-jobs-per-client", 16, 1, 100000,
            "jobs one client may have created and running here at once: by its certificate under mutual TLS, "
            "else by its address");
  c->AddString("job-owner-pattern", "",
               "under mutual TLS, a regular expression (RE2) with one capture group: where it matches a name in a "
               "client certificate, the group it captures owns the caller's jobs instead of the certificate, e.g. "
               "'^spiffe://[^/]+/ns/([^/]+)/' lets every workload of a namespace share its jobs (docs/security.md); "
               "empty: each certificate identity owns its own",
               [](const std::string& v) {
                 if (v.empty()) return absl::OkStatus();
                 RE2 re(v, RE2::Quiet);
                 if (!re.ok()) return absl::InvalidArgumentError(absl::StrCat("not a regular expression: ", re.error()));
                 if (re.NumberOfCapturingGroups() != 1) {
                   return absl::InvalidArgumentError(absl::StrCat(
                       "has ", re.NumberOfCapturingGroups(), " capture groups, not one: the group names the owner"));
                 }
                 return absl::OkStatus();
               });
}

// What the gRPC ports hold (ControlLimits).
void DeclareControlFlags(ConfigRegistry* c) {
  c->AddInt("max-connections", 4096, 1, 1000000,
            "TCP connections the gRPC ports hold at once; more are closed as they arrive");
  c->AddInt("max-connections-per-peer", 256, 1, 1000000,
            "TCP connections the gRPC ports hold from one address; more are closed as they arrive");
  c->AddInt("handshake-timeout-ms", 10000, 100, 600000,
            "a gRPC connection that has not finished its TLS and HTTP/2 handshake by then is closed");
  c->AddInt("connection-idle-timeout-ms", 300000, 1000, 86400000,
            "a gRPC connection with no call for this long is closed (workers call at every heartbeat)");
  c->AddInt("max-streams-per-connection", 64, 1, 100000, "concurrent gRPC calls on one connection");
  c->AddInt("control-memory-bytes", int64_t{256} << 20, int64_t{16} << 20, int64_t{1} << 40,
            "memory gRPC may take for its connections and calls, over all of them");
}

// Each job's size and memory.
void DeclareLimitFlags(ConfigRegistry* c) {
  c->AddInt("max-workers", 1024, 1, 65535, "workers per job");
  c->AddInt("max-rounds-in-flight", 256, 1, 1000000, "open rounds per job; more is refused with an error");
  c->AddInt("max-job-bytes", int64_t{4} << 30, int64_t{1} << 20, int64_t{1} << 40,
            "accumulator memory per job; more is refused with an error");
  c->AddInt("max-memory-bytes", int64_t{4} << 30, int64_t{1} << 20, int64_t{1} << 40,
            "accumulator memory over all jobs, at least --max-job-bytes; more is refused with an error. The "
            "process needs this, 256 MiB per data thread of freed blocks kept for reuse, and about 1 GiB more");
}

// The data packets: socket buffers, classes' DSCP, and their MAC keys.
void DeclarePacketFlags(ConfigRegistry* c) {
  c->AddInt("socket-buffer-bytes", 32 << 20, 1 << 16, 1 << 30, "UDP socket send and receive buffer size");
  c->AddString("dscp", "46,34,18,0", "DSCP code point for classes 0,1,2,3",
               [](const std::string& v) {
                 std::array<uint8_t, 4> unused;
                 return ParseDscpMap(v, &unused);
               });
  c->AddBool("data-auth", true, "give each job a key and require a MAC on every data packet (docs/security.md)");
  c->AddInt("data-key-rotation-s", 0, 0, 30 * 86400,
            "draw a new data key for each job this often, seconds; workers move to it without a pause "
            "(docs/security.md); 0: never");
  c->AddBool("per-worker-data-keys", true,
             "hand each worker keys derived for its rank, so no member can sign as another (docs/security.md); "
             "false: every member gets the job's key, for clients from before");
}

// Host stages (docs/host-stage.md).
void DeclareHostStageFlags(ConfigRegistry* c) {
  c->AddString("host-socket", kDefaultHostSocket,
               "Unix socket where this host's workers find their job's host stage (docs/host-stage.md); empty: "
               "none. The default is skipped with a warning where it cannot be served; another path must be");
  c->AddInt("host-shm-bytes", int64_t{1} << 30, int64_t{1} << 20, int64_t{1} << 40,
            "shared memory of all host stages together; a stage beyond it is refused, and its workers take the "
            "network path");
  c->AddInt("host-slot-bytes", int64_t{16} << 20, int64_t{1} << 16, int64_t{1} << 32,
            "each worker's slot in its host stage, a multiple of 4096: tensors larger than it go through in parts");
  c->AddInt("host-gather-timeout-ms", 30000, 100, 3600000,
            "how long a host stage waits for all its job's workers on this host; then they take the network path");
}

}  // namespace

void DeclareDlcpdFlags(ConfigRegistry* c) {
  DeclareServingFlags(c);
  DeclareRoundFlags(c);
  DeclareJobFlags(c);
  DeclareControlFlags(c);
  DeclareLimitFlags(c);
  DeclarePacketFlags(c);
  DeclareHostStageFlags(c);
  c->AddBool("busy-poll", false, "spin on the data socket instead of sleeping (dedicated cores only)");
  c->AddBool("result-steering", true,
             "share results to each worker over the spray paths by each path's loss rate (docs/path-spraying.md); "
             "false: equal turns");
  c->AddString("log-level", "info", "debug, info, warning or error", [](const std::string& v) {
    LogLevel unused;
    return ParseLogLevel(v, &unused);
  });
  c->AddBool("log-json", false, "write logs as one JSON object per line");
  DeclareTlsFlags(c, /*server=*/true);
  DeclareTransportFlags(c);
}

namespace {

// Ports, addresses and what dlcpd announces.
absl::Status ServingFromConfig(const ConfigRegistry& c, DlcpdOptions* out) {
  DlcpdOptions& o = *out;
  o.host = c.GetString("host");
  o.control_port = static_cast<uint16_t>(c.GetInt("port"));
  o.advertise_host = c.GetString("advertise-host");
  o.ready_file = c.GetString("ready-file");
  o.metrics_port = static_cast<int>(c.GetInt("metrics-port"));
  o.metrics_host = c.GetString("metrics-host").empty() ? o.host : c.GetString("metrics-host");
  o.metrics_slowest_ranks = static_cast<uint32_t>(c.GetInt("metrics-slowest-ranks"));
  if (o.metrics_port >= 0 && o.metrics_host.find(':') != std::string::npos) {
    // civetweb, as Debian builds it for prometheus-cpp, cannot listen on IPv6.
    return absl::InvalidArgumentError(absl::StrCat(
        c.GetString("metrics-host").empty() ? "--host '" : "--metrics-host '", o.metrics_host,
        "' is IPv6, and the metrics endpoint serves IPv4 only: set --metrics-host to an IPv4 address (0.0.0.0 for "
        "all), or turn it off with --metrics-port=-1 and read the metrics with dlcpctl stats"));
  }
  o.health_port = static_cast<int>(c.GetInt("health-port"));
  o.aggregator_id = c.GetString("id");
  return absl::OkStatus();
}

// The data plane: transport, data threads, timing and injected drops.
absl::Status DataFromConfig(const ConfigRegistry& c, DlcpdOptions* out) {
  DlcpdOptions& o = *out;
  TransportOptionsFromConfig(c, &o.data.transport);
  o.data.transport.bind_host = o.host;
  o.data.transport.port = static_cast<uint16_t>(c.GetInt("data-port"));
  o.data.transport.socket_buffer_bytes = static_cast<size_t>(c.GetInt("socket-buffer-bytes"));
  o.data.transport.busy_poll = c.GetBool("busy-poll");
  o.data.result_steering = c.GetBool("result-steering");
  if (absl::Status s = ParseDscpMap(c.GetString("dscp"), &o.data.transport.dscp); !s.ok()) return s;
  o.data.threads = static_cast<uint32_t>(c.GetInt("data-threads"));
  if (o.data.transport.port != 0 && o.data.transport.port + o.data.threads - 1 > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--data-port ", o.data.transport.port, " + --data-threads ",
                                                   o.data.threads, " runs past port 65535"));
  }
  o.data.tick = absl::Milliseconds(c.GetInt("tick-ms"));
  o.data.repair_timeout = absl::Milliseconds(c.GetInt("repair-timeout-ms"));
  o.data.round_timeout = absl::Milliseconds(c.GetInt("round-timeout-ms"));
  if (o.data.round_timeout <= o.data.repair_timeout * 4) {
    return absl::InvalidArgumentError("--round-timeout-ms must exceed 4 x --repair-timeout-ms");
  }
  o.data.inject_drop = c.GetDouble("inject-drop");
  o.data.inject_seed = static_cast<uint64_t>(c.GetInt("inject-seed"));
  if (absl::Status s = ParseClassDrops(c.GetString("inject-drop-class"), &o.data.inject_class.rate); !s.ok()) return s;
  o.data.inject_class.burst = static_cast<uint32_t>(c.GetInt("inject-burst"));
  o.data.inject_class.seed = o.data.inject_seed;
  return absl::OkStatus();
}

// Jobs: deadlines, data keys and limits.
absl::Status JobsFromConfig(const ConfigRegistry& c, DlcpdOptions* out) {
  DlcpdOptions& o = *out;
  o.job_idle_timeout = absl::Milliseconds(c.GetInt("job-idle-timeout-ms"));
  o.limits.heartbeat_timeout = absl::Milliseconds(c.GetInt("heartbeat-timeout-ms"));
  o.drain_timeout = absl::Milliseconds(c.GetInt("drain-timeout-ms"));
  o.limits.data_auth = c.GetBool("data-auth");
  o.limits.data_key_rotation = absl::Seconds(c.GetInt("data-key-rotation-s"));
  o.limits.per_worker_data_keys = c.GetBool("per-worker-data-keys");
  if (o.limits.data_key_rotation > absl::ZeroDuration() && !o.limits.data_auth) {
    return absl::InvalidArgumentError("--data-key-rotation-s rotates data keys, which --data-auth=false turns off");
  }
  if (o.job_idle_timeout <= o.limits.heartbeat_timeout) {
    return absl::InvalidArgumentError("--job-idle-timeout-ms must exceed --heartbeat-timeout-ms");
  }
  o.limits.max_jobs = static_cast<uint32_t>(c.GetInt("max-jobs"));
  o.limits.max_jobs_per_client = static_cast<uint32_t>(c.GetInt("max-jobs-per-client"));
  o.job_owner_pattern = c.GetString("job-owner-pattern");
  o.limits.max_workers = static_cast<uint32_t>(c.GetInt("max-workers"));
  o.limits.max_rounds_in_flight = static_cast<uint32_t>(c.GetInt("max-rounds-in-flight"));
  o.limits.max_job_bytes = static_cast<uint64_t>(c.GetInt("max-job-bytes"));
  o.limits.max_memory_bytes = static_cast<uint64_t>(c.GetInt("max-memory-bytes"));
  if (o.limits.max_job_bytes > o.limits.max_memory_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-job-bytes ", o.limits.max_job_bytes, " exceeds --max-memory-bytes ", o.limits.max_memory_bytes,
        ", the accumulator memory of all jobs together: no job could use its budget; raise --max-memory-bytes or "
        "lower --max-job-bytes"));
  }
  return absl::OkStatus();
}

// What the gRPC ports hold.
void ControlFromConfig(const ConfigRegistry& c, ControlLimits* control) {
  control->connections.max_connections = static_cast<uint32_t>(c.GetInt("max-connections"));
  control->connections.max_per_peer = static_cast<uint32_t>(c.GetInt("max-connections-per-peer"));
  control->handshake_timeout = absl::Milliseconds(c.GetInt("handshake-timeout-ms"));
  control->idle_timeout = absl::Milliseconds(c.GetInt("connection-idle-timeout-ms"));
  control->max_streams = static_cast<uint32_t>(c.GetInt("max-streams-per-connection"));
  control->memory_bytes = c.GetInt("control-memory-bytes");
}

// Host stages: their socket and shared memory.
absl::Status HostStagesFromConfig(const ConfigRegistry& c, DlcpdOptions* out) {
  DlcpdOptions& o = *out;
  o.host_stage.socket_path = c.GetString("host-socket");
  o.host_socket_defaulted = o.host_stage.socket_path == kDefaultHostSocket;
  o.host_stage.shm_bytes = static_cast<uint64_t>(c.GetInt("host-shm-bytes"));
  o.host_stage.slot_bytes = static_cast<uint64_t>(c.GetInt("host-slot-bytes"));
  o.host_stage.gather_timeout = absl::Milliseconds(c.GetInt("host-gather-timeout-ms"));
  if (o.host_stage.slot_bytes % 4096 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--host-slot-bytes ", o.host_stage.slot_bytes, " is not a multiple of 4096"));
  }
  const uint64_t min_slot = MinStageSlotBytes(o.host_stage.slot_bytes);
  if (const size_t smallest = StageRegionBytes(2, min_slot); smallest > o.host_stage.shm_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--host-shm-bytes ", o.host_stage.shm_bytes, " cannot hold the host stage of two workers: ", smallest,
        " bytes even with slots of ", min_slot, " bytes (a slot per worker and ", kStageBanks, " for the sums)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DlcpdOptions> DlcpdOptionsFromConfig(const ConfigRegistry& c) {
  DlcpdOptions o;
  for (auto* part : {&ServingFromConfig, &DataFromConfig, &JobsFromConfig, &HostStagesFromConfig}) {
    if (absl::Status s = part(c, &o); !s.ok()) return s;
  }
  ControlFromConfig(c, &o.control);
  if (absl::Status s = ParseLogLevel(c.GetString("log-level"), &o.log.min_level); !s.ok()) return s;
  o.log.json = c.GetBool("log-json");
  o.log.component = "dlcpd";
  o.tls = TlsOptionsFromConfig(c, /*server=*/true);
  if (absl::Status s = ValidateTlsOptions(o.tls, /*server=*/true); !s.ok()) return s;
  return o;
}

}  // namespace dlcp::server
