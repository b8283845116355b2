#include "client/ctl/rank_view.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/json_text.h"

namespace dlcp::ctl {

RankRow RowOf(const v1::RankStats& r, const std::string& aggregator) {
  return RankRow{.rank = r.rank(),
                 .host = r.host(),
                 .mean_us = r.mean_lateness_us(),
                 .p50_us = r.p50_lateness_us(),
                 .p99_us = r.p99_lateness_us(),
                 .last = r.last(),
                 .rounds = r.rounds(),
                 .nacked = r.nacked_chunks(),
                 .repaired = r.repaired_chunks(),
                 .worst_at = aggregator};
}

std::vector<RankRow> MergeRanks(const std::vector<std::pair<std::string, const v1::JobStats*>>& per_aggregator) {
  std::map<uint32_t, RankRow> by_rank;
  for (const auto& [aggregator, job] : per_aggregator) {
    for (const v1::RankStats& r : job->ranks()) {
      auto [it, fresh] = by_rank.try_emplace(r.rank(), RowOf(r, aggregator));
      if (fresh) continue;
      RankRow& row = it->second;
      if (r.mean_lateness_us() > row.mean_us) {
        row.mean_us = r.mean_lateness_us();
        row.worst_at = aggregator;
      }
      row.p50_us = std::max(row.p50_us, r.p50_lateness_us());
      row.p99_us = std::max(row.p99_us, r.p99_lateness_us());
      row.last += r.last();
      row.rounds += r.rounds();
      row.nacked += r.nacked_chunks();
      row.repaired += r.repaired_chunks();
      if (row.host.empty()) row.host = r.host();
    }
  }
  std::vector<RankRow> out;
  for (auto& [rank, row] : by_rank) out.push_back(std::move(row));
  std::stable_sort(out.begin(), out.end(), [](const RankRow& a, const RankRow& b) {
    return std::tie(a.mean_us, a.last) > std::tie(b.mean_us, b.last);
  });
  return out;
}

std::string RanksTable(const std::vector<RankRow>& rows, const std::string& indent) {
  std::string out = absl::StrFormat("%s%6s %-24s %9s %9s %9s %7s %7s %9s %9s  %s\n", indent, "RANK", "HOST", "MEAN_MS",
                                    "P50_MS", "P99_MS", "LAST_%", "ROUNDS", "NACKED", "REPAIRED", "WORST_AT");
  for (const RankRow& r : rows) {
    const double last_pct = r.rounds == 0 ? 0 : 100.0 * r.last / r.rounds;
    absl::StrAppendFormat(&out, "%s%6u %-24s %9.3f %9.3f %9.3f %7.1f %7u %9u %9u  %s\n", indent, r.rank,
                          r.host.empty() ? "-" : r.host, r.mean_us / 1000.0, r.p50_us / 1000.0, r.p99_us / 1000.0,
                          last_pct, r.rounds, r.nacked, r.repaired, r.worst_at);
  }
  return out;
}

std::string RanksJson(const std::vector<RankRow>& rows) {
  std::string out = "[";
  for (size_t i = 0; i < rows.size(); ++i) {
    const RankRow& r = rows[i];
    absl::StrAppend(&out, i ? "," : "", "{\"rank\":", r.rank, ",\"host\":", Json(r.host),
                    ",\"mean_lateness_us\":", r.mean_us, ",\"p50_lateness_us\":", r.p50_us, ",\"p99_lateness_us\":", r.p99_us, ",\"last\":", r.last,
                    ",\"rounds\":", r.rounds, ",\"nacked_chunks\":", r.nacked, ",\"repaired_chunks\":", r.repaired,
                    ",\"worst_at\":", Json(r.worst_at), "}");
  }
  return out + "]";
}

}  // namespace dlcp::ctl
