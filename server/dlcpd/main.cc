// dlcpd: the dlcp aggregator daemon. Serves gRPC control and the UDP data plane until SIGINT or
// SIGTERM, then drains (tells its workers it is going away) and shuts both down, each step
// within a deadline.
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_builder.h>

#include "common/base/clock.h"
#include "common/rpc/heartbeat.h"
#include "common/rpc/socket_marks.h"
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
#include "server/dlcpd/dlcpd_config.h"
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

// Why `host`:`port` cannot be listened on, found by binding a TCP socket there ourselves (gRPC and
// civetweb only say that they failed): "port 7400 is in use", or the system's reason.
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
  if (rc == 0) return "it could not be bound";
  if (err == EADDRINUSE) return absl::StrCat("port ", port, " is in use (another dlcpd, or another process)");
  return std::strerror(err);
}

// A refusal to start for a port: where, why, and the setting that chose it.
absl::Status CannotListen(const std::string& what, const std::string& host, int port, const std::string& flag) {
  return absl::UnavailableError(absl::StrCat("cannot listen for ", what, " on ", JoinHostPort(host, port), ": ",
                                             ListenProblem(host, port), "; set ", flag,
                                             " to a free port (0 picks one)"));
}

// The gRPC control server, on `*port` (the one asked for, or the one picked for 0). The port is
// bound exclusively: gRPC's default SO_REUSEPORT would let a second dlcpd share it, and control
// calls would alternate between the two.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartControl(const DlcpdOptions& o,
                                                           const std::shared_ptr<grpc::ServerCredentials>& credentials,
                                                           AggregatorService* service, int* port) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  // Control rides the top class, like the data plane's control messages.
  if (auto marks = ServerDscpOption(o.data.transport.dscp[0])) builder.SetOption(std::move(marks));
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(JoinHostPort(o.host, o.control_port), credentials, port);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || *port == 0) return CannotListen("control calls", o.host, o.control_port, "--port");
  return server;
}

// Kubelet's gRPC probes cannot do TLS: a plaintext server that serves nothing but health.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartHealth(const DlcpdOptions& o, HealthService* health, int* port) {
  // The default health service is a process-wide switch that each server reads as it starts: off
  // for this one, which has its own, or gRPC logs a duplicate registration as an error.
  grpc::EnableDefaultHealthCheckService(false);
  grpc::ServerBuilder builder;
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(health);
  builder.AddListeningPort(JoinHostPort(o.host, o.health_port), grpc::InsecureServerCredentials(), port);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || *port == 0) return CannotListen("health checks", o.host, o.health_port, "--health-port");
  return server;
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
  JobRegistry jobs(o.limits);
  jobs.ExportMetrics(&metrics);
  absl::StatusOr<std::unique_ptr<DataPlane>> data = DataPlane::Create(o.data, &jobs, &metrics);
  if (!data.ok()) {
    std::cerr << "dlcpd: cannot start the data plane: " << data.status().message() << "\n";
    return 1;
  }
  absl::Cleanup stop_data = [&] { (*data)->Stop(); };
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = MakeServerCredentials(o.tls);
  if (!credentials.ok()) {
    std::cerr << "dlcpd: refusing to start: " << credentials.status().message() << "\n";
    return 2;
  }
  AggregatorService service(o.aggregator_id, o.advertise_host, &jobs, data->get(), &metrics);
  int control_port = 0;
  absl::StatusOr<std::unique_ptr<grpc::Server>> server = StartControl(o, *credentials, &service, &control_port);
  if (!server.ok()) {
    std::cerr << "dlcpd: " << server.status().message() << "\n";
    return 1;
  }
  absl::Cleanup stop_server = [&] { (*server)->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2)); };
  HealthService health;
  int health_port = -1;
  absl::StatusOr<std::unique_ptr<grpc::Server>> health_server = std::unique_ptr<grpc::Server>();
  if (o.health_port >= 0) health_server = StartHealth(o, &health, &health_port);
  if (!health_server.ok()) {
    std::cerr << "dlcpd: " << health_server.status().message() << "\n";
    return 1;
  }
  absl::Cleanup stop_health = [&] {
    if (*health_server) (*health_server)->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  };
  absl::StatusOr<std::unique_ptr<PrometheusExporter>> exporter = std::unique_ptr<PrometheusExporter>();
  if (o.metrics_port >= 0) {
    exporter = PrometheusExporter::Start(o.metrics_host, static_cast<uint16_t>(o.metrics_port), &metrics);
  }
  if (!exporter.ok()) {
    std::cerr << "dlcpd: " << CannotListen("metrics", o.metrics_host, o.metrics_port, "--metrics-port").message()
              << " (" << exporter.status().message() << ")\n";
    return 1;
  }
  if (*exporter) {
    DLCP_LOG(Info) << "Prometheus metrics on http://" << JoinHostPort(o.metrics_host, (*exporter)->port())
                   << "/metrics";
  }
  absl::Cleanup stop_exporter = [&] { exporter->reset(); };
  if (o.aggregator_id.empty()) service.set_aggregator_id(JoinHostPort(o.host, control_port));
  AnnounceServing(o, **data, control_port, *exporter ? (*exporter)->port() : -1, health_port);
  const auto tend = [&] { Tend(jobs, o); };
  const int sig = ServeUntilSignal(signals, tend);
  StopServing(o, service, jobs, **server, health, signals, sig, tend);
  return 0;
}

}  // namespace
}  // namespace dlcp::server

int main(int argc, char** argv) { return dlcp::server::Main(argc, argv); }
