// dlcpd: the dlcp aggregator daemon. Serves gRPC control and the UDP data plane until SIGINT or
// SIGTERM, then drains (tells its workers it is going away) and shuts both down, each step
// within a deadline.
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/server_builder.h>

#include "common/base/clock.h"
#include "common/metrics/process_metrics.h"
#include "server/control/connection_limits.h"
#include "server/control/limited_listener.h"
#include "common/rpc/heartbeat.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/base/host_port.h"
#include "common/transport/address.h"
#include "absl/time/clock.h"
#include "absl/strings/str_join.h"
#include "common/base/build_config.h"
#include "common/base/log.h"
#include "server/control/aggregator_service.h"
#include "server/control/health_service.h"
#include "re2/re2.h"
#include "server/dlcpd/dlcpd_config.h"
#include "server/dlcpd/ipc_lock.h"
#include "server/dlcpd/systemd_notify.h"
#include "server/metrics/prometheus_exporter.h"
#include "common/transport/transport_options.h"

namespace dlcp::server {
namespace {

absl::Status WriteReadyFile(const std::string& path, int control_port, int metrics_port, int health_port,
                            const std::vector<Address>& data) {
  std::vector<int> ports;  // 0 for RDMA endpoints, which have queue pairs instead
  for (const Address& a : data) ports.push_back(a.port);
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << "{\"control_port\":" << control_port << ",\"metrics_port\":" << metrics_port
      << ",\"health_port\":" << health_port << ",\"data_ports\":["
      << absl::StrJoin(ports, ",") << "]}\n";
    if (!f) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return absl::InternalError(absl::StrCat("cannot rename to ", path));
  return absl::OkStatus();
}

// Graceful shutdown (DrainTracker): serves on, refusing joins, until every member has moved off
// (each probes this aggregator with a join as soon as it has), or every member's heartbeat has been
// answered `draining` and none has asked again for `settle` (a worker in the middle of a regroup
// puts the move off and asks again; the regroup may still need this aggregator), the deadline
// passes, or a second signal asks to stop at once.
void DrainUntilTold(AggregatorService& service, const JobRegistry& jobs, absl::Duration timeout,
                    absl::Duration settle, const sigset_t* signals, int sig, const std::function<void()>& tend) {
  const absl::Time began = MonotonicNow();
  service.drain().Begin();
  std::vector<std::string> untold = service.drain().Untold(jobs);
  if (untold.empty()) {
    DLCP_LOG(Info) << "signal " << sig << ": shutting down (no worker to tell)";
    return;
  }
  DLCP_LOG(Info) << "signal " << sig << ": draining, telling " << untold.size()
                 << " worker(s) in their next heartbeat answer, for at most " << absl::FormatDuration(timeout);
  if (absl::Status s = NotifyServiceManager(absl::StrCat("STOPPING=1\nSTATUS=draining: telling ", untold.size(),
                                                         " worker(s) this aggregator is going away"));
      !s.ok()) {
    DLCP_LOG(Warning) << "cannot tell the service manager dlcpd is stopping: " << s;
  }
  // Until every member has let go, or, failing word from some, every one was told and none asked
  // again for `settle`.
  std::vector<std::string> holding = service.drain().Holding(jobs);
  while (!holding.empty() && (!untold.empty() || MonotonicNow() - service.drain().last_told() < settle)) {
    const absl::Duration left = began + timeout - MonotonicNow();
    if (left <= absl::ZeroDuration()) {
      DLCP_LOG(Warning) << "drain deadline passed; "
                        << (untold.empty() ? "workers still asking" : "not told: " + absl::StrJoin(untold, ", "));
      return;
    }
    const timespec wait = absl::ToTimespec(std::min(left, absl::Milliseconds(50)));
    if (const int again = sigtimedwait(signals, nullptr, &wait); again > 0) {
      DLCP_LOG(Warning) << "signal " << again << " while draining: stopping now; not told: "
                        << (untold.empty() ? "none" : absl::StrJoin(untold, ", "));
      return;
    }
    tend();  // members silent past the deadline are removed, and need telling no more
    untold = service.drain().Untold(jobs);
    holding = service.drain().Holding(jobs);
  }
  DLCP_LOG(Info) << "drained in " << absl::FormatDuration(absl::Trunc(MonotonicNow() - began, absl::Milliseconds(1)))
                 << (holding.empty() ? ": every worker has moved off" : ": every worker was told");
}

// Signals are taken synchronously by the main thread; every thread started after this inherits
// the mask.
sigset_t BlockStopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// Why `host`:`port` cannot be listened on, found by binding a TCP socket there ourselves (civetweb
// only says that it failed): "port 7400 is in use", or the system's reason.
std::string ListenProblem(const std::string& host, int port) {
  absl::StatusOr<Address> a = ResolveAddress(host, static_cast<uint16_t>(port));
  if (!a.ok()) return std::string(a.status().message());
  const SockAddr sa = a->ToSockaddr();
  const int fd = ::socket(sa.get()->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::strerror(errno);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // as every server here does
  const int rc = ::bind(fd, sa.get(), sa.len);
  const int err = errno;
  ::close(fd);
  return rc == 0 ? "it could not be bound" : BindProblem(port, err);
}

// A refusal to start for a port: where, why (`problem`), and the setting that chose it.
absl::Status CannotListen(const std::string& what, const std::string& host, int port, const std::string& flag,
                          const std::string& problem) {
  return absl::UnavailableError(absl::StrCat("cannot listen for ", what, " on ", JoinHostPort(host, port), ": ",
                                             problem, "; set ", flag, " to a free port (0 picks one)"));
}

void ExportConnectionMetrics(ConnectionLimiter* limiter, MetricsRegistry* metrics) {
  using K = MetricsRegistry::Kind;
  metrics->AddComputed("dlcp_control_connections", {}, K::kGauge, "TCP connections the gRPC ports hold", [limiter] {
    limiter->Refresh();
    return static_cast<double>(limiter->held());
  });
  const std::string refused = "gRPC connections closed as they arrived, by the limit they were over "
                              "(--max-connections, --max-connections-per-peer)";
  metrics->AddComputed("dlcp_control_connections_refused_total", {{"limit", "overall"}}, K::kCounter, refused,
                       [limiter] { return static_cast<double>(limiter->refused_overall()); });
  metrics->AddComputed("dlcp_control_connections_refused_total", {{"limit", "per_peer"}}, K::kCounter, refused,
                       [limiter] { return static_cast<double>(limiter->refused_per_peer()); });
  metrics->AddComputed("dlcp_control_connections_closed_total", {{"reason", "client_certificate"}}, K::kCounter,
                       "gRPC connections dlcpd closed itself: those whose client certificate it refused, a second "
                       "after the refusal",
                       [limiter] { return static_cast<double>(limiter->closed_later()); });
}

// What every gRPC port of dlcpd bounds (ControlLimits) beyond its connections, which its
// LimitedListener bounds: how long one may sit in its handshake or idle, its calls, and gRPC's
// memory. Without them one client holds every descriptor with connections that send nothing.
void ApplyControlLimits(const ControlLimits& limits, grpc::ServerBuilder* builder) {
  builder->AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                              static_cast<int>(absl::ToInt64Milliseconds(limits.handshake_timeout)));
  builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                              static_cast<int>(absl::ToInt64Milliseconds(limits.idle_timeout)));
  builder->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, static_cast<int>(limits.max_streams));
  grpc::ResourceQuota quota("dlcpd-control");
  quota.Resize(static_cast<size_t>(limits.memory_bytes));
  builder->SetResourceQuota(quota);
}

// A gRPC server for `service` on `listener`'s port, or why it could not start.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartServer(const ControlLimits& limits, LimitedListener* listener,
                                                          const std::shared_ptr<grpc::ServerCredentials>& credentials,
                                                          grpc::Service* service) {
  grpc::ServerBuilder builder;
  ApplyControlLimits(limits, &builder);
  listener->ServeWith(&builder, credentials);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) return absl::InternalError(absl::StrCat("gRPC did not start serving port ", listener->port()));
  listener->Start();
  return server;
}

// A port for gRPC, or a refusal to start naming it and the setting that chose it.
absl::StatusOr<std::unique_ptr<LimitedListener>> ListenFor(const std::string& what, const std::string& host, int port,
                                                           const std::string& flag, uint8_t dscp,
                                                           ConnectionLimiter* limiter) {
  absl::StatusOr<std::unique_ptr<LimitedListener>> l =
      LimitedListener::Bind(host, static_cast<uint16_t>(port), dscp, limiter);
  if (l.ok()) return l;
  return CannotListen(what, host, port, flag, std::string(l.status().message()));
}

// dlcpd's gRPC ports: control, and health when --health-port asks for it. Each is accepted by a
// LimitedListener under one ConnectionLimiter, so that their connections count together.
class GrpcPorts {
 public:
  GrpcPorts(const DlcpdOptions& o, MetricsRegistry* metrics) : o_(o), limiter_(o.control.connections) {
    ExportConnectionMetrics(&limiter_, metrics);
  }
  ~GrpcPorts() { Shutdown(); }
  absl::Status Start(const std::shared_ptr<grpc::ServerCredentials>& credentials, AggregatorService* service,
                     HealthService* health);
  void Shutdown();
  int control_port() const { return control_listener_->port(); }
  int health_port() const { return health_listener_ ? health_listener_->port() : -1; }
  grpc::Server& control() { return *control_; }
  ConnectionLimiter& limiter() { return limiter_; }

 private:
  const DlcpdOptions& o_;
  ConnectionLimiter limiter_;
  std::unique_ptr<LimitedListener> control_listener_, health_listener_;
  std::unique_ptr<grpc::Server> control_, health_;
};

absl::Status GrpcPorts::Start(const std::shared_ptr<grpc::ServerCredentials>& credentials,
                              AggregatorService* service, HealthService* health) {
  const uint8_t dscp = o_.data.transport.dscp[0];
  absl::StatusOr<std::unique_ptr<LimitedListener>> control =
      ListenFor("control calls", o_.host, o_.control_port, "--port", dscp, &limiter_);
  if (!control.ok()) return control.status();
  control_listener_ = std::move(*control);
  grpc::EnableDefaultHealthCheckService(true);
  absl::StatusOr<std::unique_ptr<grpc::Server>> server = StartServer(o_.control, control_listener_.get(), credentials, service);
  if (!server.ok()) return server.status();
  control_ = std::move(*server);
  if (o_.health_port < 0) return absl::OkStatus();
  // Kubelet's gRPC probes cannot do TLS: a plaintext port that serves nothing but health.
  absl::StatusOr<std::unique_ptr<LimitedListener>> probes =
      ListenFor("health checks", o_.host, o_.health_port, "--health-port", dscp, &limiter_);
  if (!probes.ok()) return probes.status();
  health_listener_ = std::move(*probes);
  // The default health service is a process-wide switch that each server reads as it starts: off
  // for this one, which has its own, or gRPC logs a duplicate registration as an error.
  grpc::EnableDefaultHealthCheckService(false);
  server = StartServer(o_.control, health_listener_.get(), grpc::InsecureServerCredentials(), health);
  if (!server.ok()) return server.status();
  health_ = std::move(*server);
  return absl::OkStatus();
}

void GrpcPorts::Shutdown() {
  if (health_) health_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (control_) control_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  health_.reset();
  control_.reset();
  if (health_listener_) health_listener_->Stop();
  if (control_listener_) control_listener_->Stop();
}

// Says where dlcpd serves: the log, the ready file and the service manager.
void AnnounceServing(const DlcpdOptions& o, const DataPlane& data, int control_port, int metrics_port,
                     int health_port) {
  std::vector<std::string> endpoints;
  for (const Address& a : data.endpoints()) endpoints.push_back(a.qpn != 0 ? a.ToString() : absl::StrCat(a.port));
  const bool rdma = data.kind() == TransportOptions::Kind::kRdma;
  DLCP_LOG(Info) << "dlcpd " << DLCP_VERSION << " serving control " << JoinHostPort(o.host, control_port)
                 << (o.tls.plaintext ? " (plaintext)" : o.tls.ca_file.empty() ? " (TLS)" : " (mutual TLS)")
                 << (rdma ? ", data RDMA queue pairs " : ", data UDP ports ") << absl::StrJoin(endpoints, ",");
  if (!o.ready_file.empty()) {
    if (absl::Status s = WriteReadyFile(o.ready_file, control_port, metrics_port, health_port, data.endpoints());
        !s.ok()) {
      DLCP_LOG(Error) << s;
    }
  }
  if (absl::Status s = NotifyServiceManager(absl::StrCat("READY=1\nSTATUS=serving control on port ", control_port,
                                                         ", data ", rdma ? "queue pairs " : "ports ",
                                                         absl::StrJoin(endpoints, ",")));
      !s.ok()) {
    DLCP_LOG(Warning) << "cannot tell the service manager dlcpd is ready: " << s;
  }
}

// What the main thread does four times a second: fail jobs with a silent worker, move key
// rotations on, and remove jobs whose workers all vanished.
void Tend(JobRegistry& jobs, const DlcpdOptions& o) {
  for (const std::string& line : jobs.FailSilentMembers(MonotonicNanos(), o.limits.heartbeat_timeout)) {
    DLCP_LOG(Warning) << line;
  }
  for (const std::string& line : jobs.ExpireRegroups(MonotonicNow())) DLCP_LOG(Warning) << line;
  for (const std::string& line : jobs.TendKeys(MonotonicNow())) DLCP_LOG(Info) << line;
  for (const std::string& name : jobs.ReapIdle(MonotonicNanos(), o.job_idle_timeout)) {
    DLCP_LOG(Warning) << "job " << name << " removed: no heartbeat from any member for "
                      << absl::FormatDuration(o.job_idle_timeout);
  }
}

// Tends the jobs until SIGINT or SIGTERM; returns the signal.
int ServeUntilSignal(const sigset_t& signals, const std::function<void()>& tend) {
  for (;;) {
    timespec quarter{0, 250 * 1000 * 1000};
    if (const int sig = sigtimedwait(&signals, nullptr, &quarter); sig > 0) return sig;
    tend();
  }
}

// After the signal: health goes to not serving, then the drain (if configured) tells the workers.
void StopServing(const DlcpdOptions& o, AggregatorService& service, const JobRegistry& jobs, grpc::Server& server,
                 HealthService& health, const sigset_t& signals, int sig, const std::function<void()>& tend) {
  health.set_serving(false);
  if (grpc::HealthCheckServiceInterface* h = server.GetHealthCheckService()) h->SetServingStatus(false);
  if (o.drain_timeout > absl::ZeroDuration()) {
    // How long a worker with the default interval takes to ask again, and some slack.
    const absl::Duration settle =
        HeartbeatInterval(kDefaultHeartbeatInterval, o.limits.heartbeat_timeout) + absl::Milliseconds(250);
    DrainUntilTold(service, jobs, o.drain_timeout, settle, &signals, sig, tend);
  } else {
    DLCP_LOG(Info) << "signal " << sig << ": shutting down";
  }
  if (absl::Status s = NotifyServiceManager("STOPPING=1\nSTATUS=shutting down"); !s.ok()) {
    DLCP_LOG(Warning) << "cannot tell the service manager dlcpd is stopping: " << s;
  }
}

// The host socket (docs/host-stage.md). A default one that cannot be served leaves the host
// without host stages, with a warning; one that was asked for must be served.
absl::StatusOr<std::unique_ptr<HostBroker>> StartHostBroker(const DlcpdOptions& o, MetricsRegistry* metrics) {
  if (o.host_stage.socket_path.empty()) return nullptr;
  if (o.host_socket_defaulted) ::mkdir("/run/dlcp", 0755);  // EEXIST, or not root: Start says what is wrong
  absl::StatusOr<std::unique_ptr<HostBroker>> broker = HostBroker::Start(o.host_stage, metrics);
  if (broker.ok() || !o.host_socket_defaulted) return broker;
  DLCP_LOG(Warning) << "no host stages on this host: " << broker.status().message()
                    << "; its workers take the network path (set --host-socket to serve them)";
  return nullptr;
}

absl::StatusOr<DlcpdOptions> LoadOptions(int argc, char** argv, std::optional<int>* exit_code) {
  ConfigRegistry config("dlcpd", "dlcp aggregator daemon: sums gradient chunks pushed by the workers of a job.");
  DeclareDlcpdFlags(&config);
  absl::StatusOr<DlcpdOptions> opts = absl::UnknownError("not loaded");
  // TLS files are read only when serving, so --dump-config works where they are not mounted.
  auto validate = [&]() -> absl::Status {
    if (!config.positional().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", config.positional()[0], "'"));
    }
    opts = DlcpdOptionsFromConfig(config);
    return opts.status();
  };
  *exit_code = config.StartMain(argc, argv, validate, "refusing to start: ");
  return opts;
}

// Each part that starts has one way down: the scope guards stop them in the reverse order.
int Main(int argc, char** argv) {
  std::optional<int> exit_code;
  absl::StatusOr<DlcpdOptions> loaded = LoadOptions(argc, argv, &exit_code);
  if (exit_code) return *exit_code;
  const DlcpdOptions& o = *loaded;
  ConfigureLogging(o.log);
  const sigset_t signals = BlockStopSignals();
  MetricsRegistry metrics;
  ExportProcessMetrics(&metrics);
  JobRegistry jobs(o.limits);
  jobs.ExportMetrics(&metrics);
  jobs.ExportSlowestRanks(&metrics, o.metrics_slowest_ranks);
  if (o.data.transport.kind != TransportOptions::Kind::kUdp && RaiseIpcLock() == IpcLock::kRaised) {
    DLCP_LOG(Info) << "CAP_IPC_LOCK raised from this file's capabilities: RDMA buffers are pinned past the "
                      "locked-memory limit";
  }
  absl::StatusOr<std::unique_ptr<DataPlane>> data = DataPlane::Create(o.data, &jobs, &metrics);
  if (!data.ok()) {
    std::cerr << "dlcpd: cannot start the data plane: " << data.status().message() << "\n";
    return 1;
  }
  absl::Cleanup stop_data = [&] { (*data)->Stop(); };
  Labels transport = (*data)->where();  // RDMA: device, port, gid_index
  transport["kind"] = TransportKindName((*data)->kind());
  metrics.AddComputed("dlcp_transport_info", transport, MetricsRegistry::Kind::kGauge,
                      "Always 1: the data plane's transport, and over RDMA its device, port and GID index",
                      [] { return 1.0; });
  absl::StatusOr<ServerSecurity> security = MakeServerSecurity(o.tls);
  if (!security.ok()) {
    std::cerr << "dlcpd: refusing to start: " << security.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<std::unique_ptr<HostBroker>> broker = StartHostBroker(o, &metrics);
  if (!broker.ok()) {
    std::cerr << "dlcpd: refusing to start: " << broker.status().message() << "\n";
    return 2;
  }
  AggregatorService service(o.aggregator_id, o.advertise_host, &jobs, data->get(), &metrics,
                            security->client_certificates);
  HealthService health;
  GrpcPorts grpc_ports(o, &metrics);
  // A client refused for its certificate would be refused on every call of its connection (the
  // certificate is the connection's): it is closed a second after its answer went out, rather
  // than held until --connection-idle-timeout-ms.
  service.gate().set_on_refusal([&grpc_ports](const std::string& peer) {
    if (std::optional<std::pair<std::string, uint16_t>> hp = PeerHostPort(peer)) {
      grpc_ports.limiter().CloseLater(hp->first, hp->second, MonotonicNow() + absl::Seconds(1));
    }
  });
  if (!o.job_owner_pattern.empty()) service.gate().set_owner_pattern(std::make_unique<const RE2>(o.job_owner_pattern));
  if (absl::Status s = grpc_ports.Start(security->credentials, &service, &health); !s.ok()) {
    std::cerr << "dlcpd: " << s.message() << "\n";
    return 1;
  }
  absl::Cleanup stop_grpc = [&] { grpc_ports.Shutdown(); };
  absl::StatusOr<std::unique_ptr<PrometheusExporter>> exporter = std::unique_ptr<PrometheusExporter>();
  if (o.metrics_port >= 0) {
    exporter = PrometheusExporter::Start(o.metrics_host, static_cast<uint16_t>(o.metrics_port), &metrics);
  }
  if (!exporter.ok()) {
    std::cerr << "dlcpd: " << CannotListen("metrics", o.metrics_host, o.metrics_port, "--metrics-port",
                                           ListenProblem(o.metrics_host, o.metrics_port))
                                  .message()
              << " (" << exporter.status().message() << ")\n";
    return 1;
  }
  if (*exporter) {
    DLCP_LOG(Info) << "Prometheus metrics on http://" << JoinHostPort(o.metrics_host, (*exporter)->port())
                   << "/metrics";
  }
  absl::Cleanup stop_exporter = [&] { exporter->reset(); };
  if (o.aggregator_id.empty()) service.set_aggregator_id(JoinHostPort(o.host, grpc_ports.control_port()));
  AnnounceServing(o, **data, grpc_ports.control_port(), *exporter ? (*exporter)->port() : -1, grpc_ports.health_port());
  const auto tend = [&] {
    Tend(jobs, o);
    grpc_ports.limiter().CloseDue(MonotonicNow());
  };
  const int sig = ServeUntilSignal(signals, tend);
  StopServing(o, service, jobs, grpc_ports.control(), health, signals, sig, tend);
  return 0;
}

}  // namespace
}  // namespace dlcp::server

int main(int argc, char** argv) { return dlcp::server::Main(argc, argv); }
