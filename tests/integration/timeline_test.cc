// The timeline end to end: dlcp-bench workers given --timeline (the client option every surface
// takes) write one Chrome trace-event file each, with a complete span per op and its moments,
// and scripts/plot_timeline.py draws them.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/common/text_files.h"
#include "tests/integration/process_harness.h"

namespace dlcp::testing {
namespace {

TEST(Timeline, EachWorkerWritesACompleteTraceThatLoadsAndPlots) {
  char dir_template[] = "/tmp/dlcp-timeline.XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template;
  auto d = Daemon::Start(DLCPD_PATH, {});
  ASSERT_NE(d, nullptr);
  // Bounded rounds (so a STOP each) with class-0 pushes dropped at the workers, which the
  // aggregator NACKs and the workers repair.
  ProcessResult bench = RunProcess({DLCP_BENCH_PATH, "--aggregators=" + d->control(), "--plaintext", "--workers=2",
                                    "--tensor-bytes=400000", "--tensors=2", "--rounds=4", "--warmup=1",
                                    "--loss-bound=0.1", "--inject-drop-class=0:0.25", "--json",
                                    "--timeline=" + dir + "/rank%r.json"},
                                   absl::Seconds(60));
  ASSERT_EQ(bench.exit_code, 0) << bench.out;
  ASSERT_TRUE(absl::StrContains(bench.out, "\"exact\":true")) << bench.out;

  size_t ops = 0;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string trace = ReadFile(absl::StrCat(dir, "/rank", rank, ".json"));
    ASSERT_FALSE(trace.empty()) << "rank " << rank << " wrote no timeline";
    EXPECT_TRUE(absl::EndsWith(trace, "]\n")) << "not closed: " << trace.substr(trace.size() - 200);
    EXPECT_TRUE(absl::StrContains(trace, absl::StrCat("\"name\":\"dlcp rank ", rank, "\""))) << trace.substr(0, 300);
    EXPECT_TRUE(absl::StrContains(trace, "\"dropped_events\":0"));
    // (1 warm-up + 4 timed rounds) x 2 tensors, and the bench's two barriers per round.
    const size_t begun = CountOccurrences(trace, "\"ph\":\"b\"");
    EXPECT_EQ(begun, 5u * 2 + 5u * 2);
    EXPECT_EQ(CountOccurrences(trace, "\"ph\":\"e\""), begun) << "every op span ends";
    EXPECT_EQ(CountOccurrences(trace, "\"name\":\"first push\""), begun);
    // A bounded round may seal before a lagging worker pushed its last chunks, which then never
    // leave: that op has no last push.
    const size_t last_pushes = CountOccurrences(trace, "\"name\":\"last push\"");
    EXPECT_LE(last_pushes, begun);
    EXPECT_GE(last_pushes, begun / 2);
    EXPECT_GE(CountOccurrences(trace, "\"name\":\"stop\""), 5u * 2) << "each bounded round's STOP";
    EXPECT_GT(CountOccurrences(trace, "\"name\":\"nack\""), 0u);
    EXPECT_GT(CountOccurrences(trace, "\"name\":\"repairs\""), 0u);
    EXPECT_FALSE(absl::StrContains(trace, "\"error\"")) << "no op failed";
    ops += begun;
  }

  // The plot script parses both as JSON and draws every op.
  const std::string png = dir + "/timeline.png";
  ProcessResult plot = RunProcess({"/usr/bin/python3", DLCP_SOURCE_DIR "/scripts/plot_timeline.py", png,
                                   dir + "/rank0.json", dir + "/rank1.json"},
                                  absl::Seconds(60));
  ASSERT_EQ(plot.exit_code, 0) << plot.out;
  EXPECT_TRUE(absl::StrContains(plot.out, absl::StrCat("\"ops\": ", ops))) << plot.out;
  struct stat st {};
  ASSERT_EQ(stat(png.c_str(), &st), 0);
  EXPECT_GT(st.st_size, 10000);

  // A path that cannot be written is an error naming the setting, before the job starts.
  ProcessResult bad = RunProcess({DLCP_BENCH_PATH, "--aggregators=" + d->control(), "--plaintext", "--workers=1",
                                  "--rounds=1", "--timeline=/nonexistent/dir/t.json"},
                                 absl::Seconds(30));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(bad.out, "cannot write its timeline to '/nonexistent/dir/t.json' (option timeline"))
      << bad.out;
  EXPECT_EQ(d->Stop(absl::Seconds(5)), 0);
  RunProcess({"rm", "-rf", dir}, absl::Seconds(10));
}

}  // namespace
}  // namespace dlcp::testing
