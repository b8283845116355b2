// dlcpctl: an operator's view of a set of aggregators.
//   dlcpctl status --aggregators=H:P[,H:P...]   one line per aggregator: release, serving or draining, jobs, workers, rounds
//   dlcpctl jobs   --aggregators=...             every job on every aggregator
//   dlcpctl stats  --aggregators=...             every counter (nonzero ones in table form)
//   dlcpctl health --aggregators=...             grpc.health.v1; exit 0 only if all SERVING
//   dlcpctl rotate-key --job=NAME --aggregators=...
//                                                 start a rotation of the job's data key at each
// --output=table|json for all. Exit 1 if any aggregator is unreachable.
#include <cmath>
#include <grpcpp/create_channel.h>

#include <iostream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/pending_call.h"
#include "common/config/registry.h"
#include "common/security/tls_flags.h"
#include "common/wire/version_check.h"
#include "dlcp/v1/control.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace {

std::string Json(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
      continue;
    }
    out += c;
  }
  return out + "\"";
}

struct Reply {
  std::string address;
  grpc::Status status;
  dlcp::v1::Stats stats;
  std::string health;
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
                         const dlcp::ChannelSecurity& security) {
  const absl::Duration timeout = absl::Milliseconds(config.GetInt("timeout-ms"));
  const std::vector<std::string> addresses = Aggregators(config);
  std::vector<Reply> out(addresses.size());
  for (size_t i = 0; i < addresses.size(); ++i) out[i].address = addresses[i];
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
    auto answers = CallEach<dlcp::v1::GetStatsRequest, dlcp::v1::Stats>(
        addresses, security, dlcp::v1::GetStatsRequest(), timeout,
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

std::string JobsJson(const dlcp::v1::Stats& s) {
  std::string out = "[";
  for (int i = 0; i < s.jobs_size(); ++i) {
    const auto& j = s.jobs(i);
    absl::StrAppend(&out, i ? "," : "", "{\"job_id\":", j.job_id(), ",\"name\":", Json(j.job_name()),
                    ",\"world_size\":", j.world_size(), ",\"members\":", j.members(),
                    ",\"rounds_completed\":", j.rounds_completed(), ",\"rounds_in_flight\":", j.rounds_in_flight(),
                    ",\"data_key_generation\":", j.data_key_generation(), "}");
  }
  return out + "]";
}

// A JSON number that keeps a counter exact: whole values up to 2^53 as integers (60628003, not
// 6.06280e+07), others with every digit a double has.
std::string JsonNumber(double v) {
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0) return absl::StrCat(static_cast<int64_t>(v));
  if (!std::isfinite(v)) return "null";
  return absl::StrFormat("%.17g", v);
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
    std::cout << absl::StrFormat("%-22s %-24s %10s %6s %8s %10s %9s %8s\n", "AGGREGATOR", "JOB", "ID", "WORLD",
                                 "MEMBERS", "ROUNDS", "IN_FLIGHT", "DATA_KEY");
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
  if (cmd != "stats") absl::StrAppend(&item, ",\"jobs\":", JobsJson(r.stats));
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
      if (absl::string_view kind = name; absl::ConsumePrefix(&kind, "dlcp_transport_info{kind=\"")) {
        transport = std::string(kind.substr(0, kind.find('"')));
      }
    }
    std::cout << absl::StrFormat("%-22s %-22s %-10s %-8s %-9s %9d %5d %8.0f %10.0f %10.0f\n", r.address,
                                 r.stats.aggregator_id(), VersionOf(r.stats),
                                 r.stats.draining() ? "draining" : "serving", transport, r.stats.uptime_ms() / 1000,
                                 r.stats.jobs_size(), workers, rounds, rejects);
  } else if (cmd == "jobs") {
    for (const auto& j : r.stats.jobs()) {
      std::cout << absl::StrFormat("%-22s %-24s %10u %6u %8u %10u %9u %8u\n", r.address, j.job_name(), j.job_id(),
                                   j.world_size(), j.members(), j.rounds_completed(), j.rounds_in_flight(),
                                   j.data_key_generation());
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

int Run(const std::string& cmd, const dlcp::ConfigRegistry& config) {
  const bool json = config.GetString("output") == "json";
  absl::StatusOr<dlcp::ChannelSecurity> security =
      dlcp::MakeChannelSecurity(dlcp::TlsOptionsFromConfig(config, /*server=*/false));
  if (!security.ok()) {
    std::cerr << "dlcpctl: " << security.status().message() << "\n";
    return 2;
  }
  if (cmd == "rotate-key") return RotateKey(config, *security, json);
  std::vector<Reply> replies = Query(config, cmd == "health", *security);
  if (!json) PrintHeader(cmd);
  int failures = 0;
  std::vector<std::string> items;
  for (const Reply& r : replies) failures += Report(cmd, r, json, &items);
  if (json) std::cout << "[" << absl::StrJoin(items, ",") << "]\n";
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  dlcp::ConfigRegistry config("dlcpctl", "commands: status (default), jobs, stats, health, rotate-key");
  config.AddString("aggregators", "127.0.0.1:7400", "aggregators to query, HOST:PORT[,HOST:PORT...]",
                   dlcp::ValidateHostPortList);
  config.AddString("output", "table", "table or json", [](const std::string& v) {
    return v == "table" || v == "json" ? absl::OkStatus() : absl::InvalidArgumentError("must be table or json");
  });
  config.AddInt("timeout-ms", 3000, 1, 600000, "deadline of each RPC");
  config.AddString("job", "", "rotate-key: the job whose data key to rotate");
  dlcp::DeclareTlsFlags(&config, /*server=*/false);
  if (std::optional<int> exit_code = config.StartMain(argc, argv)) return *exit_code;
  const std::string cmd = config.positional().empty() ? "status" : config.positional()[0];
  if (cmd != "status" && cmd != "jobs" && cmd != "stats" && cmd != "health" && cmd != "rotate-key") {
    std::cerr << "dlcpctl: unknown command '" << cmd << "' (status|jobs|stats|health|rotate-key)\n";
    return 2;
  }
  return Run(cmd, config);
}
