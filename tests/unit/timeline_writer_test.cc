// The timeline's recorder and writer threads: every event recorded is written or counted as
// dropped, never both and never lost, with recorders on several threads at once; memory stays
// bounded when the writer falls behind; events after Close are refused. Runs under TSan too.
#include "client/timeline.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "tests/common/text_files.h"

namespace dlcp {
namespace {

uint64_t DroppedIn(const std::string& trace) {
  const std::string key = "\"dropped_events\":";
  const size_t at = trace.rfind(key);
  uint64_t v = 0;
  if (at == std::string::npos) return UINT64_MAX;
  std::string digits = trace.substr(at + key.size());
  digits = digits.substr(0, digits.find('}'));
  return absl::SimpleAtoi(digits, &v) ? v : UINT64_MAX;
}

TEST(TimelineWriter, EveryEventIsWrittenOrCountedFromManyThreads) {
  const std::string pattern = absl::StrCat("/tmp/dlcp-timeline-writer-", getpid(), "-%r.json");
  constexpr int kThreads = 4, kEach = 20000;
  // A queue far smaller than the burst: the writer must drain early, or events are dropped.
  auto timeline = Timeline::Open(pattern, 3, /*max_pending=*/4096);
  ASSERT_TRUE(timeline.ok()) << timeline.status();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        (*timeline)->Instant(uint64_t(t) << 32 | i, "repairs", MonotonicNow(), absl::StrCat("\"chunks\":", i));
      }
    });
  }
  for (auto& th : threads) th.join();
  const uint64_t dropped = (*timeline)->dropped();
  (*timeline)->Close();
  (*timeline)->Instant(1, "after close", MonotonicNow());  // refused, uncounted
  EXPECT_EQ((*timeline)->dropped(), dropped);
  const std::string path = Timeline::PathFor(pattern, 3);
  EXPECT_EQ(path, absl::StrCat("/tmp/dlcp-timeline-writer-", getpid(), "-3.json"));
  const std::string trace = testing::ReadFile(path);
  EXPECT_EQ(testing::CountOccurrences(trace, "\"name\":\"repairs\"") + dropped, uint64_t{kThreads} * kEach);
  EXPECT_EQ(DroppedIn(trace), dropped);
  EXPECT_EQ(testing::CountOccurrences(trace, "after close"), 0u);
  EXPECT_TRUE(trace.rfind("]\n") == trace.size() - 2) << "the array is closed";
  std::remove(path.c_str());
}

// Workers of one host that share a setting without %r (or %p) would all write one file.
TEST(TimelineWriter, WorkersOfAHostThatShareAPathEachGetAFileOfTheirOwn) {
  EXPECT_EQ(Timeline::PathFor("/tmp/t.json", 2, /*one_of_several=*/true), "/tmp/t-2.json");
  EXPECT_EQ(Timeline::PathFor("/tmp/trace", 2, true), "/tmp/trace-2");
  EXPECT_EQ(Timeline::PathFor("/tmp/.hidden", 2, true), "/tmp/.hidden-2");
  EXPECT_EQ(Timeline::PathFor("/tmp.d/trace", 2, true), "/tmp.d/trace-2");
  EXPECT_EQ(Timeline::PathFor("/tmp/t-%r.json", 2, true), "/tmp/t-2.json");
  EXPECT_EQ(Timeline::PathFor("/tmp/t.json", 2, /*one_of_several=*/false), "/tmp/t.json");
  EXPECT_EQ(Timeline::PathFor("/tmp/t-%p.json", 2, true), absl::StrCat("/tmp/t-", getpid(), ".json"));
}

TEST(TimelineWriter, AnUnwritablePathNamesTheSettingAndTheRank) {
  auto timeline = Timeline::Open("/nonexistent/dir/t-%r.json", 7);
  ASSERT_FALSE(timeline.ok());
  EXPECT_EQ(timeline.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(timeline.status().message().find("rank 7 cannot write its timeline to '/nonexistent/dir/t-7.json' "
                                             "(option timeline, DLCP_TIMELINE)"),
            std::string::npos)
      << timeline.status();
}

}  // namespace
}  // namespace dlcp
