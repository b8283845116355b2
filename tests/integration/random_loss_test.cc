// Random loss is not congestion, end to end: two dlcpd processes and dlcp-bench jobs of four
// workers at ε = 0.2, alternately without loss and with 10% of every droppable class's pushes
// dropped at the workers (a lossy link, not a full queue). The lossy rounds must keep the
// loss-free pace of the same run, stay within the bound, and be exact over what they include.
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

TEST(RandomLoss, BoundedRoundsKeepTheLossFreePace) {
#ifdef DLCP_UNDER_SANITIZER
  GTEST_SKIP() << "round times under a sanitizer's runtime say nothing about the data path's pace";
#endif
  std::vector<std::unique_ptr<Daemon>> daemons;
  std::vector<std::string> controls;
  for (int a = 0; a < 2; ++a) {
    daemons.push_back(Daemon::Start(DLCPD_PATH, {"--metrics-port=0"}));
    ASSERT_NE(daemons.back(), nullptr) << "dlcpd did not start";
    controls.push_back(daemons.back()->control());
  }
  // Run side by side, so both see the same load on the machine.
  std::vector<double> clean_p50, lossy_p50;
  double tolerated = 0;
  for (int pair = 0; pair < 3; ++pair) {
    for (const bool lossy : {false, true}) {
      std::vector<std::string> argv = {DLCP_BENCH_PATH, absl::StrCat("--aggregators=", absl::StrJoin(controls, ",")),
                                       "--plaintext", "--workers=4", absl::StrCat("--job=random-loss-", pair, lossy),
                                       "--tensor-bytes=17825792", "--rounds=10", "--loss-bound=0.2", "--json",
                                       "--timeout-s=100"};
      if (lossy) argv.push_back("--inject-drop-class=1:0.1,2:0.1,3:0.1");
      ProcessResult run = RunProcess(argv, absl::Seconds(110));
      ASSERT_EQ(run.exit_code, 0) << run.out;
      const std::string json = run.out.substr(run.out.rfind("{\"workers\""));
      EXPECT_NE(json.find("\"checked\":true,\"exact\":true"), std::string::npos) << json;
      EXPECT_EQ(NumberAfter(json, "bound_violations"), 0) << json;
      EXPECT_LE(NumberAfter(json, "max_round_loss"), 0.2) << json;
      (lossy ? lossy_p50 : clean_p50).push_back(NumberAfter(json, "p50_ms"));
      if (lossy) {
        EXPECT_GT(NumberAfter(json, "max_round_loss"), 0) << "nothing was lost: " << json;
        tolerated += NumberAfter(json, "losses_tolerated");
      }
    }
  }
  std::cout << "p50 ms with 10% random loss " << absl::StrJoin(lossy_p50, ", ") << "; without "
            << absl::StrJoin(clean_p50, ", ") << "\n";
  EXPECT_GT(tolerated, 0) << "no loss was read as random";
  EXPECT_LE(Median(lossy_p50), 1.3 * Median(clean_p50))
      << "p50 ms with 10% random loss " << absl::StrJoin(lossy_p50, ", ") << "; without " << absl::StrJoin(clean_p50, ", ");
  // The aggregators measured each round's tail: the wait from its bound being met to its STOP.
  for (auto& d : daemons) {
    const std::string body = HttpGet(d->metrics_port(), "/metrics", absl::Seconds(5));
    EXPECT_GT(Scraped(body, "dlcp_tail_wait_seconds_count"), 0) << body;
    EXPECT_GT(Scraped(body, "dlcp_tail_wait_ratio_count"), 0) << body;
    // Lossy rounds waited a tail: a share of their time above 0, and below all of it.
    EXPECT_GT(Scraped(body, "dlcp_tail_wait_ratio_sum"), 0) << body;
    EXPECT_LT(Scraped(body, "dlcp_tail_wait_ratio_sum"), Scraped(body, "dlcp_tail_wait_ratio_count")) << body;
  }
}

}  // namespace
}  // namespace dlcp::testing
