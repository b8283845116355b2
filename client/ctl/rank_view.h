// dlcpctl's straggler view (top, jobs --ranks): how late each rank of a job delivers its part of
// a round, as the aggregators measure it (v1::RankStats), one row per rank.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dlcp/v1/control.pb.h"

namespace dlcp::ctl {

struct RankRow {
  uint32_t rank = 0;
  std::string host;
  uint32_t mean_us = 0, p50_us = 0, p99_us = 0;
  uint32_t last = 0, rounds = 0;
  uint64_t nacked = 0, repaired = 0;
  std::string worst_at;  // the aggregator that measured mean_us
};

RankRow RowOf(const v1::RankStats& r, const std::string& aggregator);

// One job as each aggregator (by address) reports it, merged: per rank the greatest lateness any
// aggregator measured (each of mean, p50 and p99), since a rank late at one aggregator holds up the whole step (and its link
// to that one may be what is slow), with the counts summed. Sorted latest first.
std::vector<RankRow> MergeRanks(const std::vector<std::pair<std::string, const v1::JobStats*>>& per_aggregator);

// Table lines (a header, then a row per rank, each line starting with `indent`) and a JSON array.
std::string RanksTable(const std::vector<RankRow>& rows, const std::string& indent);
std::string RanksJson(const std::vector<RankRow>& rows);

}  // namespace dlcp::ctl
