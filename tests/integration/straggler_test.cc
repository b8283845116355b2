// The straggler view end to end: dlcpd processes, dlcp-bench workers of which one is slowed on
// purpose (it sleeps before each round's push, as a slower GPU would), dlcpctl top and jobs
// --ranks, the slowest-rank metrics, and the slowest rank every worker's RoundStats names.
#include <gtest/gtest.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "tests/integration/process_harness.h"

namespace dlcp::testing {
namespace {

TEST(Stragglers, ASlowedWorkerIsNamedSlowestWithinAFewRounds) {
  constexpr int kSlowRank = 2;
  constexpr int kSlowMs = 40;
  std::vector<std::unique_ptr<Daemon>> daemons;
  std::vector<std::string> controls;
  for (int a = 0; a < 2; ++a) {
    daemons.push_back(Daemon::Start(DLCPD_PATH, {"--heartbeat-timeout-ms=600", "--metrics-port=0"}));
    ASSERT_NE(daemons.back(), nullptr) << "dlcpd did not start";
    controls.push_back(daemons.back()->control());
  }
  const std::string aggs = absl::StrCat("--aggregators=", absl::StrJoin(controls, ","));
  auto bench = BackgroundProcess::Start({DLCP_BENCH_PATH, aggs, "--plaintext", "--workers=4", "--job=slowpoke",
                                         "--tensor-bytes=1000000", "--rounds=5", "--min-seconds=12",
                                         absl::StrCat("--slow-rank=", kSlowRank), absl::StrCat("--slow-ms=", kSlowMs),
                                         "--json", "--timeout-s=60"});
  ASSERT_NE(bench, nullptr);

  // dlcpctl top names the slowed rank first, about kSlowMs behind the others.
  std::string top;
  bool named = false;
  for (const absl::Time end = MonotonicNow() + absl::Seconds(20); !named && MonotonicNow() < end;) {
    top = RunProcess({DLCPCTL_PATH, "top", "slowpoke", aggs, "--plaintext", "--count=1", "--output=json"},
                     absl::Seconds(10)).out;
    const size_t ranks = top.find("\"ranks\":[");
    named = ranks != std::string::npos && NumberAfter(top, "rank", ranks) == kSlowRank;
    if (!named) absl::SleepFor(absl::Milliseconds(200));
  }
  ASSERT_TRUE(named) << top;
  // Its rounds here are the tensor's (late by kSlowMs) and the bench's barriers (not late), so its
  // mean lateness is at least a third of kSlowMs at either aggregator, and its p99 near kSlowMs.
  EXPECT_GE(NumberAfter(top, "mean_lateness_us", top.find("\"ranks\":[")), kSlowMs * 1000 / 4) << top;
  EXPECT_GE(NumberAfter(top, "p99_lateness_us", top.find("\"ranks\":[")), kSlowMs * 1000 / 2) << top;
  EXPECT_EQ(NumberAfter(top, "aggregators"), 2) << top;

  // The table form, and jobs --ranks from each aggregator.
  ProcessResult table = RunProcess({DLCPCTL_PATH, "top", "slowpoke", aggs, "--plaintext", "--count=1"}, absl::Seconds(10));
  EXPECT_EQ(table.exit_code, 0) << table.out;
  EXPECT_TRUE(absl::StrContains(table.out, absl::StrCat("slowest rank ", kSlowRank))) << table.out;
  ProcessResult jobs = RunProcess({DLCPCTL_PATH, "jobs", "--ranks", aggs, "--plaintext"}, absl::Seconds(10));
  EXPECT_EQ(jobs.exit_code, 0) << jobs.out;
  EXPECT_NE(jobs.out.find("P50_MS"), std::string::npos) << jobs.out;

  // Each aggregator's metrics name it among the job's slowest ranks (while the job runs: they go
  // with it). Scraped until they do, since each aggregator learns it at its own pace, and on a
  // loaded machine the first rounds can make another rank look as late.
  for (auto& d : daemons) {
    const std::string late = absl::StrCat("dlcp_rank_lateness_mean_seconds{job=\"slowpoke\",rank=\"", kSlowRank, "\"}");
    const std::string p99 =
        absl::StrCat("dlcp_rank_lateness_seconds{job=\"slowpoke\",quantile=\"0.99\",rank=\"", kSlowRank, "\"}");
    const std::string last = absl::StrCat("dlcp_rank_last_ratio{job=\"slowpoke\",rank=\"", kSlowRank, "\"}");
    // Last in every tensor round, and in its share of the barriers: more than a fair share of 1/4.
    auto named_slowest = [&](const std::string& body) {
      return Scraped(body, late) >= kSlowMs / 4 / 1000.0 && Scraped(body, p99) >= kSlowMs / 2 / 1000.0 &&
             Scraped(body, last) > 0.25;
    };
    std::string body;
    for (const absl::Time end = MonotonicNow() + absl::Seconds(10); MonotonicNow() < end;) {
      body = HttpGet(d->metrics_port(), "/metrics", absl::Seconds(5));
      if (named_slowest(body)) break;
      absl::SleepFor(absl::Milliseconds(200));
    }
    EXPECT_GE(Scraped(body, p99), kSlowMs / 2 / 1000.0) << body;
    EXPECT_GE(Scraped(body, late), kSlowMs / 4 / 1000.0) << body;
    EXPECT_GT(Scraped(body, last), 0.25) << body;
  }

  ProcessResult r = bench->Wait(absl::Seconds(60));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "\"exact\":true")) << r.out;
  // The workers' RoundStats name it too, from the aggregators' heartbeat answers.
  EXPECT_EQ(NumberAfter(r.out, "slowest_rank"), kSlowRank) << r.out;

  // A job that is nowhere is an error naming it.
  ProcessResult none = RunProcess({DLCPCTL_PATH, "top", "nope", aggs, "--plaintext", "--count=1"}, absl::Seconds(10));
  EXPECT_EQ(none.exit_code, 1) << none.out;
  EXPECT_TRUE(absl::StrContains(none.out, "job 'nope' is on none of the aggregators")) << none.out;
  for (auto& d : daemons) EXPECT_EQ(d->Stop(absl::Seconds(5)), 0);
}

}  // namespace
}  // namespace dlcp::testing
