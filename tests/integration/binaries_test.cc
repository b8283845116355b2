// End to end through the real binaries: dlcpd processes, dlcp-bench workers over UDP on
// 127.0.0.1, and dlcpctl. Every result is checked exactly by dlcp-bench itself.
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/integration/process_harness.h"

namespace dlcp::testing {
namespace {

struct BenchCase {
  std::string name;
  int aggregators;
  int workers;
  std::vector<std::string> dlcpd_flags;
  std::vector<std::string> bench_flags;
};

void PrintTo(const BenchCase& c, std::ostream* os) { *os << c.name; }

class BinariesTest : public ::testing::TestWithParam<BenchCase> {};

TEST_P(BinariesTest, DlcpBenchIsExact) {
  const BenchCase& c = GetParam();
  std::vector<std::unique_ptr<Daemon>> daemons;
  std::vector<std::string> controls;
  for (int a = 0; a < c.aggregators; ++a) {
    daemons.push_back(Daemon::Start(DLCPD_PATH, c.dlcpd_flags));
    ASSERT_NE(daemons.back(), nullptr) << "dlcpd did not start";
    controls.push_back(daemons.back()->control());
  }
  std::vector<std::string> argv = {DLCP_BENCH_PATH, absl::StrCat("--aggregators=", absl::StrJoin(controls, ",")),
                                   absl::StrCat("--workers=", c.workers), "--timeout-s=90"};
  argv.insert(argv.end(), c.bench_flags.begin(), c.bench_flags.end());
  ProcessResult r = RunProcess(argv, absl::Seconds(100));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("\"exact\":true"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("results exact: yes"), std::string::npos) << r.out;

  ProcessResult ctl = RunProcess({DLCPCTL_PATH, "status", absl::StrCat("--aggregators=", absl::StrJoin(controls, ",")),
                                  "--output=json"},
                                 absl::Seconds(10));
  EXPECT_EQ(ctl.exit_code, 0) << ctl.out;
  EXPECT_NE(ctl.out.find("\"dlcp_rounds_completed\""), std::string::npos) << ctl.out;
  ProcessResult health =
      RunProcess({DLCPCTL_PATH, "health", absl::StrCat("--aggregators=", absl::StrJoin(controls, ","))}, absl::Seconds(10));
  EXPECT_EQ(health.exit_code, 0) << health.out;
  EXPECT_NE(health.out.find(": SERVING"), std::string::npos) << health.out;
  for (auto& d : daemons) EXPECT_EQ(d->Stop(absl::Seconds(5)), 0) << "dlcpd did not exit cleanly on SIGTERM";
}

INSTANTIATE_TEST_SUITE_P(
    Jobs, BinariesTest,
    ::testing::Values(
        BenchCase{"one_aggregator_four_workers", 1, 4, {}, {"--tensor-bytes=400000", "--tensors=2", "--rounds=5"}},
        BenchCase{"two_aggregators_four_workers", 2, 4, {"--data-threads=2"},
                  {"--tensor-bytes=1000000", "--tensors=2", "--rounds=5"}},
        BenchCase{"one_aggregator_drop10", 1, 4, {"--inject-drop=0.1"}, {"--tensor-bytes=400000", "--rounds=5"}},
        BenchCase{"two_aggregators_drop10", 2, 4, {"--inject-drop=0.1", "--inject-seed=9"},
                  {"--tensor-bytes=1000000", "--tensors=2", "--rounds=5"}},
        BenchCase{"late_joiner", 2, 4, {}, {"--tensor-bytes=200000", "--rounds=5", "--late-rank=3", "--late-ms=1500"}},
        BenchCase{"odd_size", 2, 3, {}, {"--tensor-bytes=123460", "--chunk-bytes=1000", "--rounds=5"}},
        BenchCase{"tensor_smaller_than_a_chunk", 1, 2, {}, {"--tensor-bytes=12", "--rounds=5"}}),
    [](const auto& info) { return info.param.name; });

TEST(Binaries, CApiFromC) {
  auto d = Daemon::Start(DLCPD_PATH, {});
  ASSERT_NE(d, nullptr);
  ProcessResult r = RunProcess({C_API_SMOKE_PATH, d->control()}, absl::Seconds(60));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("c api: ok"), std::string::npos) << r.out;
}

TEST(Binaries, DlcpdRefusesBadConfigurationNamingTheSetting) {
  ProcessResult r = RunProcess({DLCPD_PATH, "--inject-drop=2"}, absl::Seconds(10));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("--inject-drop"), std::string::npos) << r.out;
  r = RunProcess({DLCPD_PATH, "--data-threads=0"}, absl::Seconds(10));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("--data-threads"), std::string::npos) << r.out;
  r = RunProcess({DLCPD_PATH, "--bogus=1"}, absl::Seconds(10));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("--bogus"), std::string::npos) << r.out;
}

TEST(Binaries, DumpConfigShowsSources) {
  ProcessResult r = RunProcess({DLCPD_PATH, "--dump-config", "--port=1234"}, absl::Seconds(10));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("port=1234  # flag"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("repair-timeout-ms=20  # default"), std::string::npos) << r.out;
}

TEST(Binaries, DlcpctlReportsAnUnreachableAggregator) {
  ProcessResult r = RunProcess({DLCPCTL_PATH, "status", "--aggregators=127.0.0.1:1", "--timeout-ms=500"},
                               absl::Seconds(10));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("UNREACHABLE"), std::string::npos) << r.out;
  r = RunProcess({DLCPCTL_PATH, "health", "--aggregators=127.0.0.1:1", "--timeout-ms=500"}, absl::Seconds(10));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("UNREACHABLE"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace dlcp::testing
