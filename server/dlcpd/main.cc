// dlcpd: the dlcp aggregator daemon. Serves gRPC control and the UDP data plane until SIGINT or
// SIGTERM, then drains (tells its workers it is going away) and shuts both down, each step
// within a deadline.
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>

#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/server_builder.h>

#include "common/base/clock.h"
#include "common/rpc/heartbeat.h"
#include "common/rpc/socket_marks.h"
#include "absl/strings/str_cat.h"
#include "common/base/host_port.h"
#include "absl/time/clock.h"
#include "absl/strings/str_join.h"
#include "common/base/build_config.h"
#include "common/base/log.h"
#include "server/control/aggregator_service.h"
#include "server/control/health_service.h"
#include "server/dlcpd/dlcpd_config.h"
#include "server/dlcpd/systemd_notify.h"
#include "server/metrics/prometheus_exporter.h"

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

int Main(int argc, char** argv) {
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
  if (std::optional<int> exit_code = config.StartMain(argc, argv, validate, "refusing to start: ")) return *exit_code;
  ConfigureLogging(opts->log);

  // Signals are taken synchronously by the main thread; every other thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  MetricsRegistry metrics;
  JobRegistry jobs(opts->limits);
  jobs.ExportMetrics(&metrics);
  absl::StatusOr<std::unique_ptr<DataPlane>> data = DataPlane::Create(opts->data, &jobs, &metrics);
  if (!data.ok()) {
    std::cerr << "dlcpd: cannot start the data plane: " << data.status().message() << "\n";
    return 1;
  }

  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials = MakeServerCredentials(opts->tls);
  if (!credentials.ok()) {
    std::cerr << "dlcpd: refusing to start: " << credentials.status().message() << "\n";
    (*data)->Stop();
    return 2;
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  // Control rides the top class, like the data plane's control messages.
  if (auto marks = ServerDscpOption(opts->data.transport.dscp[0])) builder.SetOption(std::move(marks));
  int control_port = 0;
  builder.AddListeningPort(JoinHostPort(opts->host, opts->control_port), *credentials, &control_port);
  AggregatorService service(opts->aggregator_id, opts->advertise_host, &jobs, data->get(), &metrics);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || control_port == 0) {
    std::cerr << "dlcpd: cannot listen on " << JoinHostPort(opts->host, opts->control_port) << "\n";
    (*data)->Stop();
    return 1;
  }
  // Kubelet's gRPC probes cannot do TLS: a plaintext server that serves nothing but health.
  std::unique_ptr<grpc::Server> health_server;
  HealthService health;
  int health_port = -1;
  if (opts->health_port >= 0) {
    // The default health service is a process-wide switch that each server reads as it starts:
    // off for this one, which has its own, or gRPC logs a duplicate registration as an error.
    grpc::EnableDefaultHealthCheckService(false);
    grpc::ServerBuilder hb;
    hb.RegisterService(&health);
    hb.AddListeningPort(JoinHostPort(opts->host, opts->health_port), grpc::InsecureServerCredentials(),
                        &health_port);
    health_server = hb.BuildAndStart();
    if (!health_server || health_port == 0) {
      std::cerr << "dlcpd: cannot listen for health checks on " << JoinHostPort(opts->host, opts->health_port) << "\n";
      server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
      (*data)->Stop();
      return 1;
    }
  }
  std::unique_ptr<PrometheusExporter> exporter;
  if (opts->metrics_port >= 0) {
    absl::StatusOr<std::unique_ptr<PrometheusExporter>> e =
        PrometheusExporter::Start(opts->metrics_host, static_cast<uint16_t>(opts->metrics_port), &metrics);
    if (!e.ok()) {
      std::cerr << "dlcpd: cannot serve metrics: " << e.status().message() << "\n";
      server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
      (*data)->Stop();
      return 1;
    }
    exporter = std::move(*e);
    DLCP_LOG(Info) << "Prometheus metrics on http://" << JoinHostPort(opts->metrics_host, exporter->port()) << "/metrics";
  }
  if (opts->aggregator_id.empty()) service.set_aggregator_id(JoinHostPort(opts->host, control_port));
  std::vector<std::string> endpoints;
  for (const Address& a : (*data)->endpoints()) endpoints.push_back(a.qpn != 0 ? a.ToString() : absl::StrCat(a.port));
  const bool rdma = (*data)->kind() == TransportOptions::Kind::kRdma;
  DLCP_LOG(Info) << "dlcpd " << DLCP_VERSION << " serving control " << JoinHostPort(opts->host, control_port)
                 << (opts->tls.plaintext ? " (plaintext)" : opts->tls.ca_file.empty() ? " (TLS)" : " (mutual TLS)")
                 << (rdma ? ", data RDMA queue pairs " : ", data UDP ports ") << absl::StrJoin(endpoints, ",");
  if (!opts->ready_file.empty()) {
    if (absl::Status s = WriteReadyFile(opts->ready_file, control_port, exporter ? exporter->port() : -1, health_port,
                                    (*data)->endpoints()); !s.ok()) {
      DLCP_LOG(Error) << s;
    }
  }
  if (absl::Status s = NotifyServiceManager(absl::StrCat("READY=1\nSTATUS=serving control on port ", control_port,
                                                         ", data ", rdma ? "queue pairs " : "ports ",
                                                         absl::StrJoin(endpoints, ",")));
      !s.ok()) {
    DLCP_LOG(Warning) << "cannot tell the service manager dlcpd is ready: " << s;
  }

  // The main thread waits for a signal and, four times a second, fails jobs with a silent worker,
  // moves key rotations on and removes jobs whose workers all vanished.
  const auto tend = [&] {
    for (const std::string& line : jobs.FailSilentMembers(MonotonicNanos(), opts->limits.heartbeat_timeout)) {
      DLCP_LOG(Warning) << line;
    }
    for (const std::string& line : jobs.ExpireRegroups(MonotonicNow())) DLCP_LOG(Warning) << line;
    for (const std::string& line : jobs.TendKeys(MonotonicNow())) DLCP_LOG(Info) << line;
    for (const std::string& name : jobs.ReapIdle(MonotonicNanos(), opts->job_idle_timeout)) {
      DLCP_LOG(Warning) << "job " << name << " removed: no heartbeat from any member for "
                        << absl::FormatDuration(opts->job_idle_timeout);
    }
  };
  int sig = 0;
  for (;;) {
    timespec quarter{0, 250 * 1000 * 1000};
    sig = sigtimedwait(&signals, nullptr, &quarter);
    if (sig > 0) break;
    tend();
  }
  health.set_serving(false);
  if (grpc::HealthCheckServiceInterface* h = server->GetHealthCheckService()) h->SetServingStatus(false);
  if (opts->drain_timeout > absl::ZeroDuration()) {
    // How long a worker with the default interval takes to ask again, and some slack.
    const absl::Duration settle =
        HeartbeatInterval(kDefaultHeartbeatInterval, opts->limits.heartbeat_timeout) + absl::Milliseconds(250);
    DrainUntilTold(service, jobs, opts->drain_timeout, settle, &signals, sig, tend);
  } else {
    DLCP_LOG(Info) << "signal " << sig << ": shutting down";
  }
  if (absl::Status s = NotifyServiceManager("STOPPING=1\nSTATUS=shutting down"); !s.ok()) {
    DLCP_LOG(Warning) << "cannot tell the service manager dlcpd is stopping: " << s;
  }
  exporter.reset();
  if (health_server) health_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  (*data)->Stop();
  return 0;
}

}  // namespace
}  // namespace dlcp::server

int main(int argc, char** argv) { return dlcp::server::Main(argc, argv); }
