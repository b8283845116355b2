// Soak: 10,000 rounds through a real dlcpd. Its resident memory after the soak may exceed its
// warmed-up size by less than 5%, and every result must stay exact.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "tests/integration/process_harness.h"

namespace dlcp::testing {
namespace {

long RssKib(int pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      long v = 0;
      std::string num = line.substr(6);
      num.erase(0, num.find_first_not_of(" \t"));
      num = num.substr(0, num.find(' '));
      if (absl::SimpleAtoi(num, &v)) return v;
    }
  }
  return -1;
}

ProcessResult RunBench(const Daemon& d, int rounds, const std::string& job) {
  return RunProcess({DLCP_BENCH_PATH, "--plaintext", "--aggregators=" + d.control(), "--workers=2", "--tensors=2",
                     "--tensor-bytes=20000", absl::StrCat("--rounds=", rounds), "--job=" + job, "--timeout-s=300",
                     "--json"},
                    absl::Seconds(310));
}

TEST(Soak, TenThousandRoundsKeepMemoryFlat) {
  auto d = Daemon::Start(DLCPD_PATH, {"--data-threads=2"});
  ASSERT_NE(d, nullptr);
  ProcessResult warm = RunBench(*d, 1000, "soak-warmup");
  ASSERT_EQ(warm.exit_code, 0) << warm.out;
  const long before = RssKib(d->pid());
  ASSERT_GT(before, 0);
  const absl::Time start = MonotonicNow();
  ProcessResult soak = RunBench(*d, 10000, "soak");
  ASSERT_EQ(soak.exit_code, 0) << soak.out;
  EXPECT_NE(soak.out.find("\"exact\":true"), std::string::npos) << soak.out;
  const long after = RssKib(d->pid());
  std::printf("soak: 10000 rounds in %.1f s; dlcpd RSS %ld KiB after warm-up, %ld KiB after soak (%+.2f%%)\n",
              absl::ToDoubleSeconds(MonotonicNow() - start), before, after, 100.0 * (after - before) / before);
  EXPECT_LT(after, before * 105 / 100) << "dlcpd grew from " << before << " KiB to " << after << " KiB";
}

}  // namespace
}  // namespace dlcp::testing
