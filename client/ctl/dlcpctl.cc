// dlcpctl: an operator's view of a set of aggregators.
//   dlcpctl status --aggregators=H:P[,H:P...]   one line per aggregator: release, serving or draining, jobs, workers, rounds
//   dlcpctl jobs   --aggregators=... [--ranks]   every job on every aggregator [and each rank's lateness]
//   dlcpctl top JOB --aggregators=...            the job's ranks, the latest first, refreshed every
//                                                 --interval-ms (--count times; 0: until interrupted)
//   dlcpctl stats  --aggregators=...             every counter (nonzero ones in table form)
//   dlcpctl health --aggregators=...             grpc.health.v1; exit 0 only if all SERVING
//   dlcpctl doctor --aggregators=...             checks this host for dlcp, and probes each
//                                                 aggregator with a real round trip; exit 1 on a fail
//   dlcpctl rotate-key --job=NAME --aggregators=...
//                                                 start a rotation of the job's data key at each
// --output=table|json for all. Exit 1 if any aggregator is unreachable.
#include <grpcpp/create_channel.h>

#include <iostream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/base/json_text.h"
#include "client/ctl/doctor.h"
#include "client/ctl/rank_view.h"
#include "client/pending_call.h"
#include "common/config/registry.h"
#include "common/security/tls_flags.h"
#include "common/transport/transport_options.h"
#include "common/wire/version_check.h"
#include "dlcp/v1/control.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace {

using dlcp::Json;
using dlcp::JsonNumber;

struct Reply {
  std::string address;
  grpc::Status status;
  dlcp::v1::Stats stats;
  std::string health;
  bool ranks = false;  // asked for each job's ranks
};

std::vector<std::string> Aggregators(const dlcp::ConfigRegistry& config) {
  std::vector<std::string> out;
  for (absl::string_view a : absl::StrSplit(config.GetString("aggregators"), ',', absl::SkipEmpty())) {
    out.emplace_back(a);
  }
  return out;
}

// One call per aggregator, all in flight at once: aggregators that do not answer (when an operator
// looks, something is often wrong) cost the deadline once, not once each. `start(stub, ctx, req,
// resp, done)` starts one call on a stub from `new_stub(channel)`. Answers in the order given.
template <typename Req, typename Resp, typename NewStub, typename Start>
std::vector<std::pair<grpc::Status, Resp>> CallEach(const std::vector<std::string>& addresses,
                                                    const dlcp::ChannelSecurity& security, const Req& req,
                                                    absl::Duration timeout, NewStub new_stub, Start start) {
  using Stub = typename decltype(new_stub(std::shared_ptr<grpc::Channel>()))::element_type;
  std::vector<std::unique_ptr<Stub>> stubs;  // outlive the calls, declared after them
  std::vector<std::unique_ptr<dlcp::PendingCall<Req, Resp>>> calls;
  for (const std::string& address : addresses) {
    stubs.push_back(new_stub(grpc::CreateCustomChannel(address, security.credentials, security.arguments)));
    Stub* stub = stubs.back().get();
    calls.push_back(std::make_unique<dlcp::PendingCall<Req, Resp>>(
        [&](grpc::ClientContext* ctx, const Req* rq, Resp* rs, auto done) { start(stub, ctx, rq, rs, std::move(done)); },
        req, timeout));
  }
  std::vector<std::pair<grpc::Status, Resp>> out;
  for (auto& call : calls) {
    grpc::Status st = call->Wait();
    out.emplace_back(std::move(st), std::move(call->response()));
  }
  return out;
}

std::vector<Reply> Query(const dlcp::ConfigRegistry& config, bool health,
                         const dlcp::ChannelSecurity& security, bool ranks = false) {
  const absl::Duration timeout = absl::Milliseconds(config.GetInt("timeout-ms"));
  const std::vector<std::string> addresses = Aggregators(config);
  std::vector<Reply> out(addresses.size());
  for (size_t i = 0; i < addresses.size(); ++i) {
    out[i].address = addresses[i];
    out[i].ranks = ranks;
  }
  if (health) {
    auto answers = CallEach<grpc::health::v1::HealthCheckRequest, grpc::health::v1::HealthCheckResponse>(
        addresses, security, grpc::health::v1::HealthCheckRequest(), timeout,
        [](std::shared_ptr<grpc::Channel> ch) { return grpc::health::v1::Health::NewStub(ch); },
        [](auto* stub, auto* ctx, auto* rq, auto* rs, auto done) { stub->async()->Check(ctx, rq, rs, std::move(done)); });
    for (size_t i = 0; i < out.size(); ++i) {
      out[i].status = answers[i].first;
      out[i].health = grpc::health::v1::HealthCheckResponse::ServingStatus_Name(answers[i].second.status());
    }
  } else {
    dlcp::v1::GetStatsRequest req;
    req.set_ranks(ranks);
    auto answers = CallEach<dlcp::v1::GetStatsRequest, dlcp::v1::Stats>(
        addresses, security, req, timeout,
        [](std::shared_ptr<grpc::Channel> ch) { return dlcp::v1::Aggregator::NewStub(ch); },
        [](auto* stub, auto* ctx, auto* rq, auto* rs, auto done) { stub->async()->GetStats(ctx, rq, rs, std::move(done)); });
    for (size_t i = 0; i < out.size(); ++i) {
      out[i].status = answers[i].first;
      out[i].stats = std::move(answers[i].second);
    }
  }
  return out;
}

// rotate-key: one RotateDataKey per aggregator. Exit 1 if any failed (unreachable, or the job is
// not there).
int RotateKey(const dlcp::ConfigRegistry& config, const dlcp::ChannelSecurity& security, bool json) {
  const std::string job = config.GetString("job");
  if (job.empty()) {
    std::cerr << "dlcpctl: rotate-key needs --job=NAME\n";
    return 2;
  }
  const absl::Duration timeout = absl::Milliseconds(config.GetInt("timeout-ms"));
  int failures = 0;
  std::vector<std::string> items;
  const std::vector<std::string> addresses = Aggregators(config);
  dlcp::v1::RotateDataKeyRequest req;
  req.set_job_name(job);
  auto answers = CallEach<dlcp::v1::RotateDataKeyRequest, dlcp::v1::RotateDataKeyResponse>(
      addresses, security, req, timeout,
      [](std::shared_ptr<grpc::Channel> ch) { return dlcp::v1::Aggregator::NewStub(ch); },
      [](auto* stub, auto* ctx, auto* rq, auto* rs, auto done) { stub->async()->RotateDataKey(ctx, rq, rs, std::move(done)); });
  for (size_t i = 0; i < addresses.size(); ++i) {
    const std::string& address = addresses[i];
    const auto& [st, resp] = answers[i];
    if (!st.ok()) ++failures;
    if (json) {
      items.push_back(st.ok() ? absl::StrCat("{\"aggregator\":", Json(address), ",\"started\":",
                                             resp.started() ? "true" : "false", ",\"data_key_generation\":",
                                             resp.data_key_generation(), "}")
                              : absl::StrCat("{\"aggregator\":", Json(address), ",\"error\":", Json(st.error_message()), "}"));
    } else if (!st.ok()) {
      std::cout << address << ": ERROR (" << st.error_message() << ")\n";
    } else {
      std::cout << address << ": data key " << resp.data_key_generation()
                << (resp.started() ? " drawn, rolling out\n" : " still rolling out from an earlier rotation; try again\n");
    }
  }
  if (json) std::cout << "[" << absl::StrJoin(items, ",") << "]\n";
  return failures == 0 ? 0 : 1;
}

std::map<std::string, double> Sorted(const dlcp::v1::Stats& s) { return {s.counters().begin(), s.counters().end()}; }

std::vector<dlcp::ctl::RankRow> RowsOf(const dlcp::v1::JobStats& j, const std::string& aggregator) {
  std::vector<dlcp::ctl::RankRow> rows;
  for (const auto& r : j.ranks()) rows.push_back(dlcp::ctl::RowOf(r, aggregator));
  return rows;
}

std::string JobsJson(const std::string& aggregator, const dlcp::v1::Stats& s, bool ranks) {
  std::string out = "[";
  for (int i = 0; i < s.jobs_size(); ++i) {
    const auto& j = s.jobs(i);
    absl::StrAppend(&out, i ? "," : "", "{\"job_id\":", j.job_id(), ",\"name\":", Json(j.job_name()),
                    ",\"world_size\":", j.world_size(), ",\"members\":", j.members(),
                    ",\"rounds_completed\":", j.rounds_completed(), ",\"rounds_in_flight\":", j.rounds_in_flight(),
                    ",\"data_key_generation\":", j.data_key_generation(), ",\"owner\":", Json(j.owner()));
    if (ranks) absl::StrAppend(&out, ",\"ranks\":", dlcp::ctl::RanksJson(RowsOf(j, aggregator)));
    out += "}";
  }
  return out + "]";
}

std::string CountersJson(const dlcp::v1::Stats& s) {
  std::string out = "{";
  bool first = true;
  for (const auto& [name, value] : Sorted(s)) {
    absl::StrAppend(&out, first ? "" : ",", Json(name), ":", JsonNumber(value));
    first = false;
  }
  return out + "}";
}

// The header line of `cmd`'s table, where it has one.
void PrintHeader(const std::string& cmd) {
  if (cmd == "status") {
    std::cout << absl::StrFormat("%-22s %-22s %-10s %-8s %-9s %9s %5s %8s %10s %10s\n", "AGGREGATOR", "ID", "VERSION",
                                 "STATE", "TRANSPORT", "UPTIME_S", "JOBS", "WORKERS", "ROUNDS", "REJECTS");
  } else if (cmd == "jobs") {
    std::cout << absl::StrFormat("%-22s %-24s %10s %6s %8s %10s %9s %8s  %s\n", "AGGREGATOR", "JOB", "ID", "WORLD",
                                 "MEMBERS", "ROUNDS", "IN_FLIGHT", "DATA_KEY", "OWNER");
  }
}

// An aggregator from before releases were reported does not say.
std::string VersionOf(const dlcp::v1::Stats& s) { return s.version().empty() ? "unknown" : s.version(); }

std::string StatsItem(const std::string& cmd, const Reply& r) {
  std::string item = absl::StrCat("{\"aggregator\":", Json(r.address), ",\"id\":", Json(r.stats.aggregator_id()),
                                  ",\"version\":", Json(VersionOf(r.stats)), ",\"wire_version\":",
                                  dlcp::wire::AnnouncedWireVersion(r.stats.wire_version()),
                                  ",\"draining\":", r.stats.draining() ? "true" : "false",
                                  ",\"uptime_ms\":", r.stats.uptime_ms());
  if (cmd != "stats") absl::StrAppend(&item, ",\"jobs\":", JobsJson(r.address, r.stats, r.ranks));
  if (cmd != "jobs") absl::StrAppend(&item, ",\"counters\":", CountersJson(r.stats));
  return item + "}";
}

void PrintStats(const std::string& cmd, const Reply& r) {
  const auto counters = Sorted(r.stats);
  if (cmd == "status") {
    double workers = 0, rounds = 0, rejects = 0;
    std::string transport = "unknown";  // an aggregator from before it said
    for (const auto& j : r.stats.jobs()) workers += j.members();
    for (const auto& [name, value] : counters) {
      if (name.rfind("dlcp_rounds_total{", 0) == 0) rounds += value;
      if (name.rfind("dlcp_rejects_total{", 0) == 0) rejects += value;
      if (absl::string_view info = name; absl::ConsumePrefix(&info, "dlcp_transport_info{")) {
        // Labels come sorted: device, gid_index and port (RDMA) may stand before kind.
        if (size_t at = info.find("kind=\""); at != absl::string_view::npos) {
          info.remove_prefix(at + 6);
          transport = std::string(info.substr(0, info.find('"')));
        }
      }
    }
    std::cout << absl::StrFormat("%-22s %-22s %-10s %-8s %-9s %9d %5d %8.0f %10.0f %10.0f\n", r.address,
                                 r.stats.aggregator_id(), VersionOf(r.stats),
                                 r.stats.draining() ? "draining" : "serving", transport, r.stats.uptime_ms() / 1000,
                                 r.stats.jobs_size(), workers, rounds, rejects);
  } else if (cmd == "jobs") {
    for (const auto& j : r.stats.jobs()) {
      std::cout << absl::StrFormat("%-22s %-24s %10u %6u %8u %10u %9u %8u  %s\n", r.address, j.job_name(), j.job_id(),
                                   j.world_size(), j.members(), j.rounds_completed(), j.rounds_in_flight(),
                                   j.data_key_generation(), j.owner());
      if (r.ranks) std::cout << dlcp::ctl::RanksTable(RowsOf(j, r.address), "    ");
    }
  } else {
    std::cout << r.address << " (" << r.stats.aggregator_id() << ")\n";
    for (const auto& [name, value] : counters) {
      if (value != 0) std::cout << absl::StrFormat("  %-58s %.17g\n", name, value);
    }
  }
}

// One aggregator's answer: a JSON item into `items`, or its lines printed. Returns whether it
// counts as a failure (unreachable, or not serving health).
bool Report(const std::string& cmd, const Reply& r, bool json, std::vector<std::string>* items) {
  if (!r.status.ok()) {
    if (json) {
      items->push_back(
          absl::StrCat("{\"aggregator\":", Json(r.address), ",\"error\":", Json(r.status.error_message()), "}"));
    } else {
      std::cout << r.address << ": UNREACHABLE (" << r.status.error_message() << ")\n";
    }
    return true;
  }
  if (cmd == "health") {
    if (json) {
      items->push_back(absl::StrCat("{\"aggregator\":", Json(r.address), ",\"status\":", Json(r.health), "}"));
    } else {
      std::cout << r.address << ": " << r.health << "\n";
    }
    return r.health != "SERVING";
  }
  if (json) {
    items->push_back(StatsItem(cmd, r));
  } else {
    PrintStats(cmd, r);
  }
  return false;
}

// One look of `top`: the job's ranks merged over every aggregator that has it. Returns whether
// every aggregator answered and at least one has the job.
bool TopOnce(const std::string& job, const dlcp::ConfigRegistry& config, const dlcp::ChannelSecurity& security,
             bool json) {
  const std::vector<Reply> replies = Query(config, /*health=*/false, security, /*ranks=*/true);
  std::vector<std::pair<std::string, const dlcp::v1::JobStats*>> found;
  std::string problems;
  uint32_t world = 0;
  for (const Reply& r : replies) {
    if (!r.status.ok()) {
      absl::StrAppend(&problems, r.address, ": UNREACHABLE (", r.status.error_message(), ")\n");
      continue;
    }
    for (const auto& j : r.stats.jobs()) {
      if (j.job_name() != job) continue;
      found.emplace_back(r.address, &j);
      world = j.world_size();
    }
  }
  if (found.empty()) absl::StrAppend(&problems, "job '", job, "' is on none of the aggregators (dlcpctl jobs lists them)\n");
  const std::vector<dlcp::ctl::RankRow> rows = dlcp::ctl::MergeRanks(found);
  if (json) {
    std::cout << "{\"job\":" << Json(job) << ",\"world_size\":" << world << ",\"aggregators\":" << found.size()
              << ",\"ranks\":" << dlcp::ctl::RanksJson(rows) << "}\n";
  } else {
    std::cout << absl::StrFormat("job %s: world %u, on %u aggregator(s), %s\n", job, world, found.size(),
                                 rows.empty() ? "no round delivered yet"
                                              : absl::StrFormat("slowest rank %u (%.3f ms behind the first on average)",
                                                                rows[0].rank, rows[0].mean_us / 1000.0));
    std::cout << dlcp::ctl::RanksTable(rows, "") << std::flush;
  }
  std::cerr << problems;
  return problems.empty();
}

// top: TopOnce every --interval-ms, --count times (0: until interrupted). Exit 1 if the last look
// found an aggregator unreachable or the job nowhere.
int Top(const dlcp::ConfigRegistry& config, const dlcp::ChannelSecurity& security, bool json) {
  std::string job = config.GetString("job");
  if (job.empty() && config.positional().size() > 1) job = config.positional()[1];
  if (job.empty()) {
    std::cerr << "dlcpctl: top needs a job: dlcpctl top JOB (or --job=NAME)\n";
    return 2;
  }
  const int64_t count = config.GetInt("count");
  bool ok = true;
  for (int64_t i = 0; count == 0 || i < count; ++i) {
    if (i > 0) {
      absl::SleepFor(absl::Milliseconds(config.GetInt("interval-ms")));
      if (!json) std::cout << "\n";
    }
    ok = TopOnce(job, config, security, json);
  }
  return ok ? 0 : 1;
}

// doctor: the host's checks, then each aggregator's probe. Exit 1 if any check failed.
int Doctor(const dlcp::ConfigRegistry& config, bool json) {
  dlcp::ctl::DoctorOptions o;
  o.sysfs = config.GetString("sysfs-root");
  o.procfs = config.GetString("procfs-root");
  o.aggregators = Aggregators(config);
  o.socket_buffer_bytes = static_cast<size_t>(config.GetInt("socket-buffer-bytes"));
  o.data_threads = static_cast<uint32_t>(config.GetInt("data-threads"));
  o.probe.transport.rdma.recv_slots = static_cast<uint32_t>(config.GetInt("rdma-recv-slots"));
  o.probe.tls = dlcp::TlsOptionsFromConfig(config, /*server=*/false);
  o.probe.rpc_timeout = o.probe.op_timeout = absl::Milliseconds(config.GetInt("timeout-ms"));
  o.probe.transport.kind = *dlcp::ParseTransportKind(config.GetString("transport"));  // validated as a flag
  o.host_socket = config.GetString("host-socket");
  std::vector<dlcp::ctl::Finding> findings = dlcp::ctl::CheckHost(o);
  for (dlcp::ctl::Finding& f : dlcp::ctl::ProbeHostStage(o)) findings.push_back(std::move(f));
  for (dlcp::ctl::Finding& f : dlcp::ctl::ProbeAggregators(o)) findings.push_back(std::move(f));
  std::cout << (json ? dlcp::ctl::FindingsJson(findings) + "\n" : dlcp::ctl::FormatFindings(findings));
  return dlcp::ctl::AnyFailed(findings) ? 1 : 0;
}

int Run(const std::string& cmd, const dlcp::ConfigRegistry& config) {
  const bool json = config.GetString("output") == "json";
  absl::StatusOr<dlcp::ChannelSecurity> security =
      dlcp::MakeChannelSecurity(dlcp::TlsOptionsFromConfig(config, /*server=*/false));
  if (!security.ok()) {
    std::cerr << "dlcpctl: " << security.status().message() << "\n";
    return 2;
  }
  if (cmd == "rotate-key") return RotateKey(config, *security, json);
  if (cmd == "top") return Top(config, *security, json);
  if (cmd == "doctor") return Doctor(config, json);
  std::vector<Reply> replies = Query(config, cmd == "health", *security, config.GetBool("ranks"));
  if (!json) PrintHeader(cmd);
  int failures = 0;
  std::vector<std::string> items;
  for (const Reply& r : replies) failures += Report(cmd, r, json, &items);
  if (json) std::cout << "[" << absl::StrJoin(items, ",") << "]\n";
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  dlcp::ConfigRegistry config("dlcpctl", "commands: status (default), jobs, top JOB, stats, health, doctor, rotate-key");
  config.AddString("aggregators", "127.0.0.1:7400",
                   "aggregators to query, HOST:PORT[,HOST:PORT...]; empty: none (doctor: the host's checks only)",
                   [](const std::string& v) { return v.empty() ? absl::OkStatus() : dlcp::ValidateHostPortList(v); });
  config.AddString("output", "table", "table or json", [](const std::string& v) {
    return v == "table" || v == "json" ? absl::OkStatus() : absl::InvalidArgumentError("must be table or json");
  });
  config.AddInt("timeout-ms", 3000, 1, 600000, "deadline of each RPC");
  config.AddString("job", "", "rotate-key, top: the job");
  config.AddBool("ranks", false, "jobs: each rank's lateness too, as each aggregator measures it");
  config.AddInt("interval-ms", 2000, 100, 3600000, "top: time between looks");
  config.AddInt("count", 0, 0, INT64_MAX, "top: looks to take; 0: until interrupted");
  config.AddString("transport", "auto", "doctor: the data plane its probes use: auto, udp or rdma",
                   [](const std::string& v) { return dlcp::ParseTransportKind(v).status(); });
  config.AddInt("socket-buffer-bytes", 32 << 20, 4096, int64_t{1} << 31,
                "doctor: the UDP socket buffers dlcpd asks for (its --socket-buffer-bytes)");
  config.AddInt("data-threads", 1, 1, 64, "doctor: dlcpd's --data-threads, for the locked memory RDMA needs");
  config.AddInt("rdma-recv-slots", 4096, 64, 65536, "doctor: dlcpd's --rdma-recv-slots, for the same");
  config.AddString("host-socket", "/run/dlcp/dlcpd.sock",
                   "doctor: the Unix socket of this host's dlcpd (dlcpd --host-socket), where workers find their "
                   "host stage; empty: not checked");
  config.AddString("sysfs-root", "/sys", "doctor: where sysfs is (tests)");
  config.AddString("procfs-root", "/proc", "doctor: where procfs is (tests)");
  dlcp::DeclareTlsFlags(&config, /*server=*/false);
  if (std::optional<int> exit_code = config.StartMain(argc, argv)) return *exit_code;
  const std::string cmd = config.positional().empty() ? "status" : config.positional()[0];
  if (cmd != "status" && cmd != "jobs" && cmd != "top" && cmd != "stats" && cmd != "health" && cmd != "doctor" &&
      cmd != "rotate-key") {
    std::cerr << "dlcpctl: unknown command '" << cmd << "' (status|jobs|top|stats|health|doctor|rotate-key)\n";
    return 2;
  }
  return Run(cmd, config);
}
