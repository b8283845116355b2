// dlcpctl: operator's view of a set of aggregators.
//   dlcpctl status --aggregators=H:P[,H:P...] [--output=table|json]
//   dlcpctl health --aggregators=H:P[,H:P...]     (grpc.health.v1; exit 0 if all SERVING)
#include <grpcpp/create_channel.h>

#include <cstdio>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/session.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "common/config/registry.h"

namespace {

int Status(const dlcp::ConfigRegistry& config) {
  const bool json = config.GetString("output") == "json";
  const absl::Duration timeout = absl::Milliseconds(config.GetInt("timeout-ms"));
  int failures = 0;
  std::vector<std::string> json_items;
  for (absl::string_view agg : absl::StrSplit(config.GetString("aggregators"), ',', absl::SkipEmpty())) {
    auto stub = dlcp::v1::Aggregator::NewStub(grpc::CreateChannel(std::string(agg), grpc::InsecureChannelCredentials()));
    dlcp::v1::GetStatsRequest req;
    dlcp::v1::Stats stats;
    grpc::Status st = dlcp::CallWithDeadline(
        [&](grpc::ClientContext* ctx, const dlcp::v1::GetStatsRequest* rq, dlcp::v1::Stats* rs, auto cb) {
          stub->async()->GetStats(ctx, rq, rs, std::move(cb));
        },
        req, &stats, timeout);
    if (!st.ok()) {
      ++failures;
      if (json) {
        json_items.push_back(absl::StrCat("{\"aggregator\":\"", agg, "\",\"error\":\"", st.error_message(), "\"}"));
      } else {
        std::cout << agg << ": UNREACHABLE (" << st.error_message() << ")\n";
      }
      continue;
    }
    if (json) {
      std::string item = absl::StrCat("{\"aggregator\":\"", agg, "\",\"id\":\"", stats.aggregator_id(),
                                      "\",\"uptime_ms\":", stats.uptime_ms(), ",\"jobs\":[");
      for (int i = 0; i < stats.jobs_size(); ++i) {
        const auto& j = stats.jobs(i);
        absl::StrAppend(&item, i ? "," : "", "{\"job_id\":", j.job_id(), ",\"name\":\"", j.job_name(),
                        "\",\"world_size\":", j.world_size(), ",\"members\":", j.members(),
                        ",\"rounds_completed\":", j.rounds_completed(), ",\"rounds_in_flight\":", j.rounds_in_flight(),
                        "}");
      }
      absl::StrAppend(&item, "],\"counters\":{");
      bool first = true;
      for (const auto& [name, value] : std::map<std::string, double>(stats.counters().begin(), stats.counters().end())) {
        absl::StrAppend(&item, first ? "" : ",", "\"", name, "\":", value);
        first = false;
      }
      absl::StrAppend(&item, "}}");
      json_items.push_back(item);
      continue;
    }
    std::cout << agg << " (" << stats.aggregator_id() << "), up " << stats.uptime_ms() / 1000 << " s\n";
    std::cout << absl::StrFormat("  %-24s %10s %7s %8s %12s %9s\n", "JOB", "ID", "WORLD", "MEMBERS", "ROUNDS", "IN-FLIGHT");
    for (const auto& j : stats.jobs()) {
      std::cout << absl::StrFormat("  %-24s %10u %7u %8u %12u %9u\n", j.job_name(), j.job_id(), j.world_size(),
                                   j.members(), j.rounds_completed(), j.rounds_in_flight());
    }
    std::cout << "  counters:\n";
    for (const auto& [name, value] : std::map<std::string, double>(stats.counters().begin(), stats.counters().end())) {
      if (value != 0) std::cout << absl::StrFormat("    %-40s %.17g\n", name, value);
    }
  }
  if (json) {
    std::cout << "[";
    for (size_t i = 0; i < json_items.size(); ++i) std::cout << (i ? "," : "") << json_items[i];
    std::cout << "]\n";
  }
  return failures == 0 ? 0 : 1;
}

// Asks each aggregator's grpc.health.v1 service; exit 0 only if all are SERVING.
int Health(const dlcp::ConfigRegistry& config) {
  int failures = 0;
  for (absl::string_view agg : absl::StrSplit(config.GetString("aggregators"), ',', absl::SkipEmpty())) {
    auto stub = grpc::health::v1::Health::NewStub(grpc::CreateChannel(std::string(agg), grpc::InsecureChannelCredentials()));
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status st = dlcp::CallWithDeadline(
        [&](grpc::ClientContext* ctx, const grpc::health::v1::HealthCheckRequest* rq,
            grpc::health::v1::HealthCheckResponse* rs, auto cb) { stub->async()->Check(ctx, rq, rs, std::move(cb)); },
        req, &resp, absl::Milliseconds(config.GetInt("timeout-ms")));
    std::string state = st.ok() ? grpc::health::v1::HealthCheckResponse::ServingStatus_Name(resp.status())
                                : absl::StrCat("UNREACHABLE (", st.error_message(), ")");
    if (!st.ok() || resp.status() != grpc::health::v1::HealthCheckResponse::SERVING) ++failures;
    std::cout << agg << ": " << state << "\n";
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  dlcp::ConfigRegistry config("dlcpctl", "commands: status, health");
  config.AddString("aggregators", "127.0.0.1:7400", "aggregators to query, HOST:PORT[,HOST:PORT...]",
                   dlcp::ValidateHostPortList);
  config.AddString("output", "table", "table or json", [](const std::string& v) {
    return v == "table" || v == "json" ? absl::OkStatus() : absl::InvalidArgumentError("must be table or json");
  });
  config.AddInt("timeout-ms", 3000, 1, 600000, "deadline of each RPC");
  absl::Status s = config.LoadFromMain(argc, argv);
  if (config.help_requested()) {
    std::cout << config.Help();
    return 0;
  }
  if (!s.ok()) {
    std::cerr << s.message() << "\n";
    return 2;
  }
  if (config.dump_requested()) {
    std::cout << config.Dump();
    return 0;
  }
  const std::string cmd = config.positional().empty() ? "status" : config.positional()[0];
  if (cmd == "status") return Status(config);
  if (cmd == "health") return Health(config);
  std::cerr << "dlcpctl: unknown command '" << cmd << "' (status|health)\n";
  return 2;
}
