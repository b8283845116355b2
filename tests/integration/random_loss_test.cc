// Random loss is not congestion, end to end: two dlcpd processes and dlcp-bench jobs of four
// workers at ε = 0.2, alternately without loss and with 10% of every droppable class's pushes
// dropped where they leave for the network (a lossy link, not a full queue). The lossy rounds must
// keep the loss-free pace of the run beside them, stay within the bound, and be exact over what
// they include. Both data paths with a network leg: every worker pushing its own, and two hosts'
// stages of two that push once per host. (A stage that holds the whole job has no network leg to
// lose a packet on.)
// Before round trips told the two apart, every such loss cut the sender's window, and the lossy
// rounds took about 1.5 times as long (docs/congestion.md, "Random loss").
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/sanitizers.h"
#include "tests/integration/process_harness.h"

namespace dlcp::testing {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Every worker pushing its own, or two hosts' stages of two workers, each with its own dlcpd.
class RandomLoss : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    for (int a = 0; a < 2; ++a) {
      daemons_.push_back(Daemon::Start(DLCPD_PATH, {"--metrics-port=0"}));
      ASSERT_NE(daemons_.back(), nullptr) << "dlcpd did not start";
      controls_.push_back(daemons_.back()->control());
    }
  }
  // Runs one job: each worker's JSON line, in rank order (one line for the whole job when every
  // worker pushes its own, as dlcp-bench spawns and sums them up then).
  std::vector<std::string> RunJob(const std::string& job, bool lossy) const;

  std::vector<std::unique_ptr<Daemon>> daemons_;
  std::vector<std::string> controls_;
};

std::vector<std::string> RandomLoss::RunJob(const std::string& job, bool lossy) const {
  std::vector<std::string> argv = {DLCP_BENCH_PATH, absl::StrCat("--aggregators=", absl::StrJoin(controls_, ",")),
                                   "--plaintext", "--workers=4", "--job=" + job, "--tensor-bytes=17825792",
                                   "--rounds=10", "--loss-bound=0.2", "--json", "--timeout-s=100"};
  if (lossy) argv.push_back("--inject-drop-class=1:0.1,2:0.1,3:0.1");
  if (!GetParam()) {
    argv.push_back("--host-stage=false");
    ProcessResult run = RunProcess(argv, absl::Seconds(110));
    EXPECT_EQ(run.exit_code, 0) << run.out;
    const size_t at = run.out.rfind("{\"workers\"");
    return {at == std::string::npos ? "" : run.out.substr(at)};
  }
  std::vector<std::unique_ptr<BackgroundProcess>> workers;
  for (int rank = 0; rank < 4; ++rank) {
    std::vector<std::string> one = argv;
    one.insert(one.end(), {absl::StrCat("--rank=", rank), "--local-size=2",
                           "--host-socket=" + daemons_[rank / 2]->host_socket()});
    workers.push_back(BackgroundProcess::Start(one));
  }
  std::vector<std::string> lines;
  for (int rank = 0; rank < 4; ++rank) {
    ProcessResult r = workers[rank]->Wait(absl::Seconds(110));
    EXPECT_EQ(r.exit_code, 0) << "rank " << rank << ":\n" << r.out;
    const size_t at = r.out.rfind("{\"rank\"");
    lines.push_back(at == std::string::npos ? "" : r.out.substr(at, r.out.find('\n', at) - at));
  }
  return lines;
}

TEST_P(RandomLoss, BoundedRoundsKeepTheLossFreePace) {
#ifdef DLCP_UNDER_SANITIZER
  GTEST_SKIP() << "round times under a sanitizer's runtime say nothing about the data path's pace";
#endif
  // Each lossy run is compared with the loss-free run just before it, so both saw the same load
  // on the machine; the median of those ratios is held to the bound.
  std::vector<double> clean_p50, lossy_p50, ratios;
  double tolerated = 0;
  for (int pair = 0; pair < 5; ++pair) {
    for (const bool lossy : {false, true}) {
      double p50 = 0, loss = 0;
      for (const std::string& json : RunJob(absl::StrCat("random-loss-", pair, lossy), lossy)) {
        EXPECT_NE(json.find("\"checked\":true"), std::string::npos) << json;
        EXPECT_NE(json.find("\"exact\":true"), std::string::npos) << json;
        EXPECT_EQ(NumberAfter(json, "bound_violations"), 0) << json;
        EXPECT_LE(NumberAfter(json, "max_round_loss"), 0.2) << json;
        if (GetParam()) {
          EXPECT_EQ(NumberAfter(json, "host_stage_size"), 2) << "no stage formed:\n" << json;
        } else {
          EXPECT_EQ(NumberAfter(json, "staged_workers"), 0) << json;
        }
        p50 = std::max(p50, NumberAfter(json, "p50_ms"));
        loss = std::max(loss, NumberAfter(json, "max_round_loss"));
        if (lossy) tolerated += NumberAfter(json, "losses_tolerated");
      }
      (lossy ? lossy_p50 : clean_p50).push_back(p50);
      if (lossy) {
        ratios.push_back(p50 / clean_p50.back());
        EXPECT_GT(loss, 0) << "nothing was lost in pair " << pair;
      }
    }
  }
  std::cout << "p50 ms with 10% random loss " << absl::StrJoin(lossy_p50, ", ") << "; without "
            << absl::StrJoin(clean_p50, ", ") << "\n";
  EXPECT_GT(tolerated, 0) << "no loss was read as random";
  // Through two stages the lossy rounds measured 1.16 to 1.27 of the loss-free ones on a 2-core
  // machine, against 1.1 to 1.2 per worker; rounds that read the loss as congestion took 1.5.
  EXPECT_LE(Median(ratios), GetParam() ? 1.35 : 1.3)
      << "p50 ms with 10% random loss " << absl::StrJoin(lossy_p50, ", ") << "; without " << absl::StrJoin(clean_p50, ", ");
  // The aggregators measured each round's tail: the wait from its bound being met to its STOP.
  for (auto& d : daemons_) {
    const std::string body = HttpGet(d->metrics_port(), "/metrics", absl::Seconds(5));
    EXPECT_GT(Scraped(body, "dlcp_tail_wait_seconds_count"), 0) << body;
    EXPECT_GT(Scraped(body, "dlcp_tail_wait_ratio_count"), 0) << body;
    // Lossy rounds waited a tail: a share of their time above 0, and below all of it.
    EXPECT_GT(Scraped(body, "dlcp_tail_wait_ratio_sum"), 0) << body;
    EXPECT_LT(Scraped(body, "dlcp_tail_wait_ratio_sum"), Scraped(body, "dlcp_tail_wait_ratio_count")) << body;
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, RandomLoss, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) { return p.param ? "TwoHostStages" : "PerWorker"; });

}  // namespace
}  // namespace dlcp::testing
