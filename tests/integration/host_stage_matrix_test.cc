// Every feature on every data path, through the real binaries (docs/host-stage.md): a job of four
// dlcp-bench workers with no host stage, with one stage that holds the whole job, and with two
// stages of two that push to two dlcpd; reliable and under a loss bound with drops injected;
// float32 and bfloat16 payloads; tensors below a slot and above one. In every cell the results
// are exact (under a bound: exact over their contributors, the bound held and class 0 whole),
// the stage formed where one should, every rank's timeline holds its ops, and rank 2, slowed on
// purpose, is named the job's slowest rank.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/common/text_files.h"
#include "tests/integration/process_harness.h"

namespace dlcp::testing {
namespace {

enum class Layout { kNoStage, kWholeJob, kTwoStages };
constexpr int kWorkers = 4;
constexpr int kSlowRank = 2;
constexpr int kSlowMs = 30;
constexpr int kSlotBytes = 262144;

struct Cell {
  Layout layout;
  double bound;
  bool bf16;
  bool above_slot;
};

std::string LayoutName(Layout l) {
  return l == Layout::kNoStage ? "NoStage" : l == Layout::kWholeJob ? "WholeJobStage" : "TwoStages";
}

// The flags every worker of the cell runs with.
std::vector<std::string> BenchFlags(const Cell& c, const std::string& aggregators, const std::string& job,
                                    const std::string& timeline) {
  std::vector<std::string> argv = {DLCP_BENCH_PATH, "--plaintext", "--aggregators=" + aggregators,
                                   absl::StrCat("--workers=", kWorkers), "--job=" + job,
                                   absl::StrCat("--tensor-bytes=", c.above_slot ? 2 * kSlotBytes + 100000 : 100000),
                                   "--rounds=5", "--min-seconds=4", "--json", "--timeout-s=100",
                                   "--timeline=" + timeline, absl::StrCat("--loss-bound=", c.bound),
                                   absl::StrCat("--payload-encoding=", c.bf16 ? "bf16" : "f32"),
                                   absl::StrCat("--host-stage=", c.layout != Layout::kNoStage)};
  if (c.bound > 0) argv.push_back("--inject-drop-class=1:0.05,2:0.05,3:0.05");
  return argv;
}

class StageMatrix : public ::testing::TestWithParam<Cell> {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/dlcp-matrix-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override { (void)system(("rm -rf '" + dir_ + "'").c_str()); }

  // Runs the cell's job: each worker's JSON line, in rank order.
  std::vector<std::string> Run(const Cell& c) const;
  std::string dir_;
};

std::string LastJson(const std::string& out) {
  const size_t at = out.rfind("{\"rank\"");
  return at == std::string::npos ? "" : out.substr(at, out.find('\n', at) - at);
}

// One dlcpd per host: one host for the first two layouts, two for the last.
std::vector<std::string> StageMatrix::Run(const Cell& c) const {
  const std::vector<std::string> daemon = {"--metrics-port=0", absl::StrCat("--host-slot-bytes=", kSlotBytes)};
  const int hosts = c.layout == Layout::kTwoStages ? 2 : 1;
  std::vector<std::unique_ptr<Daemon>> daemons;
  std::string aggregators;
  for (int h = 0; h < hosts; ++h) {
    daemons.push_back(Daemon::Start(DLCPD_PATH, daemon));
    if (daemons.back() == nullptr) return {};
    absl::StrAppend(&aggregators, h ? "," : "", daemons.back()->control());
  }
  std::vector<std::unique_ptr<BackgroundProcess>> workers;
  for (int rank = 0; rank < kWorkers; ++rank) {
    std::vector<std::string> argv = BenchFlags(c, aggregators, "matrix", dir_ + "/t-%r.json");
    argv.insert(argv.end(), {absl::StrCat("--rank=", rank), absl::StrCat("--local-size=", kWorkers / hosts),
                             "--host-socket=" + daemons[rank * hosts / kWorkers]->host_socket(),
                             absl::StrCat("--step-delay-ms=", rank == kSlowRank ? kSlowMs : 0)});
    workers.push_back(BackgroundProcess::Start(argv));
  }
  std::vector<std::string> lines;
  for (int rank = 0; rank < kWorkers; ++rank) {
    ProcessResult r = workers[rank]->Wait(absl::Seconds(100));
    EXPECT_EQ(r.exit_code, 0) << "rank " << rank << ":\n" << r.out;
    lines.push_back(LastJson(r.out));
  }
  return lines;
}

TEST_P(StageMatrix, ExactStagedTracedAndTheSlowRankNamed) {
  const Cell c = GetParam();
  const std::vector<std::string> lines = Run(c);
  ASSERT_EQ(lines.size(), size_t{kWorkers});
  const int stage_size = c.layout == Layout::kNoStage ? 0 : c.layout == Layout::kWholeJob ? kWorkers : 2;
  for (int i = 0; i < kWorkers; ++i) {
    const std::string& json = lines[i];
    const int rank = static_cast<int>(NumberAfter(json, "rank"));
    ASSERT_GE(rank, 0) << json;
    EXPECT_NE(json.find("\"exact\":true"), std::string::npos) << json;
    // bfloat16 under a bound is not checked digit by digit: the bound and class 0 are.
    if (!(c.bf16 && c.bound > 0)) {
      EXPECT_NE(json.find("\"checked\":true"), std::string::npos) << json;
    }
    EXPECT_EQ(NumberAfter(json, "bound_violations"), 0) << json;
    EXPECT_EQ(NumberAfter(json, "left_out_c0"), 0) << json;
    EXPECT_LE(NumberAfter(json, "max_round_loss"), c.bound) << json;
    EXPECT_EQ(NumberAfter(json, "host_stage_size"), stage_size) << "the stage did not form as it should:\n" << json;
    EXPECT_EQ(NumberAfter(json, "slowest_rank"), kSlowRank) << json;
    // Every rank's timeline holds its ops (an async span each, begun and ended) and is closed.
    const std::string trace = ReadFile(absl::StrCat(dir_, "/t-", rank, ".json"));
    EXPECT_GE(CountOccurrences(trace, "\"ph\":\"e\""), 5u) << "rank " << rank << "'s timeline:\n" << trace.substr(0, 2000);
    EXPECT_NE(trace.find("dlcp timeline closed"), std::string::npos) << "rank " << rank;
    if (c.layout != Layout::kNoStage) {
      EXPECT_NE(trace.find("\"summed\""), std::string::npos) << "rank " << rank << " shows no stage step";
    }
    if (c.layout == Layout::kTwoStages && rank % 2 == 0) {
      EXPECT_NE(trace.find("\"network leg\""), std::string::npos) << "rank " << rank << " shows no network leg";
    }
  }
}

std::vector<Cell> AllCells() {
  std::vector<Cell> cells;
  for (Layout layout : {Layout::kNoStage, Layout::kWholeJob, Layout::kTwoStages}) {
    for (double bound : {0.0, 0.05}) {
      for (bool bf16 : {false, true}) {
        for (bool above : {false, true}) cells.push_back({layout, bound, bf16, above});
      }
    }
  }
  return cells;
}

INSTANTIATE_TEST_SUITE_P(EveryPath, StageMatrix, ::testing::ValuesIn(AllCells()), [](const auto& info) {
  const Cell& c = info.param;
  return absl::StrCat(LayoutName(c.layout), c.bound > 0 ? "Bounded" : "Reliable", c.bf16 ? "Bf16" : "F32",
                      c.above_slot ? "AboveASlot" : "BelowASlot");
});

}  // namespace
}  // namespace dlcp::testing
