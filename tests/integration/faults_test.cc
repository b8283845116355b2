// Workers that die or freeze mid-job, with real processes and real signals: the survivors must
// fail within the heartbeat deadline with an error naming the rank, nothing may hang, and the job
// must run again once restarted.
#include <gtest/gtest.h>
#include <signal.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/integration/process_harness.h"

namespace dlcp::testing {
namespace {

constexpr int kWorkers = 3;
constexpr int kHeartbeatTimeoutMs = 1500;

std::vector<std::string> Worker(const Daemon& d, const std::string& job, int rank) {
  return {DLCP_BENCH_PATH, "--plaintext", "--aggregators=" + d.control(), absl::StrCat("--workers=", kWorkers),
          absl::StrCat("--rank=", rank), "--job=" + job, "--tensor-bytes=200000", "--rounds=1000000",
          "--op-timeout-ms=60000"};
}

std::unique_ptr<Daemon> StartDaemon() {
  return Daemon::Start(DLCPD_PATH, {absl::StrCat("--heartbeat-timeout-ms=", kHeartbeatTimeoutMs),
                                    "--job-idle-timeout-ms=10000"});
}

// Starts all ranks and lets them run rounds for a while.
std::vector<std::unique_ptr<BackgroundProcess>> StartJob(const Daemon& d, const std::string& job) {
  std::vector<std::unique_ptr<BackgroundProcess>> workers;
  for (int r = 0; r < kWorkers; ++r) workers.push_back(BackgroundProcess::Start(Worker(d, job, r)));
  absl::SleepFor(absl::Milliseconds(1500));
  return workers;
}

void ExpectSurvivorsFailNamingRank(std::vector<std::unique_ptr<BackgroundProcess>>& workers, int dead,
                                   absl::Time since) {
  for (int r = 0; r < kWorkers; ++r) {
    if (r == dead) continue;
    ProcessResult res = workers[r]->Wait(absl::Seconds(15));
    const absl::Duration took = absl::Now() - since;
    EXPECT_NE(res.exit_code, 0) << "rank " << r << " did not fail:\n" << res.out;
    EXPECT_NE(res.exit_code, -1) << "rank " << r << " hung and was killed:\n" << res.out;
    EXPECT_NE(res.out.find(absl::StrCat("worker rank ", dead)), std::string::npos) << res.out;
    EXPECT_NE(res.out.find("ABORTED"), std::string::npos) << res.out;
    // Detection within the deadline, plus heartbeat spacing and scheduling on a loaded machine.
    EXPECT_LT(took, absl::Milliseconds(kHeartbeatTimeoutMs) + absl::Seconds(3)) << "rank " << r;
  }
}

TEST(Faults, KilledWorkerFailsTheOthersNamingItAndTheJobRestarts) {
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  auto workers = StartJob(*d, "kill-test");
  workers[2]->Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  ExpectSurvivorsFailNamingRank(workers, 2, killed);
  workers[2]->Wait(absl::Seconds(5));

  // Restarted, the whole job runs again under the same name, exactly.
  ProcessResult again = RunProcess({DLCP_BENCH_PATH, "--plaintext", "--aggregators=" + d->control(),
                                    absl::StrCat("--workers=", kWorkers), "--job=kill-test", "--tensor-bytes=200000",
                                    "--rounds=5", "--timeout-s=60"},
                                   absl::Seconds(70));
  EXPECT_EQ(again.exit_code, 0) << again.out;
  EXPECT_NE(again.out.find("results exact: yes"), std::string::npos) << again.out;
}

TEST(Faults, KilledWorkerRestartsAndTheJobGoesOnWithIt) {
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  auto worker = [&](int rank, const std::string& rounds) {
    std::vector<std::string> argv = Worker(*d, "rejoin-test", rank);
    argv[7] = rounds;
    argv.push_back("--retry-aborted");  // a trainer that runs a failed step again
    argv.push_back("--loss-bound=0");
    return BackgroundProcess::Start(argv);
  };
  std::vector<std::unique_ptr<BackgroundProcess>> workers;
  for (int r = 0; r < kWorkers; ++r) workers.push_back(worker(r, "--rounds=1000000"));
  absl::SleepFor(absl::Milliseconds(1500));
  workers[2]->Signal(SIGKILL);
  workers[2]->Wait(absl::Seconds(5));
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(workers[r]->WaitForOutput("running it again", absl::Seconds(15))) << workers[r]->Output();
    EXPECT_NE(workers[r]->Output().find("worker rank 2"), std::string::npos) << workers[r]->Output();
  }
  // Restarted, it runs 30 rounds with the others, exactly; they go on from round 0 with it.
  auto restarted = worker(2, "--rounds=30");
  ProcessResult res = restarted->Wait(absl::Seconds(60));
  EXPECT_EQ(res.exit_code, 0) << res.out;
  EXPECT_NE(res.out.find("\"exact\":true"), std::string::npos) << res.out;
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(workers[r]->WaitForOutput("is back; it goes on from round 0", absl::Seconds(5)))
        << workers[r]->Output();
    ProcessResult s = workers[r]->Wait(absl::ZeroDuration());
    EXPECT_EQ(s.exit_code, -1) << "rank " << r << " stopped:\n" << s.out;  // it retries, never gives up
    EXPECT_EQ(s.out.find(", expected "), std::string::npos) << s.out;
  }
}

TEST(Faults, FrozenWorkerIsDroppedAndLearnsItWhenItWakes) {
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  auto workers = StartJob(*d, "stop-test");
  workers[1]->Signal(SIGSTOP);
  const absl::Time stopped = absl::Now();
  ExpectSurvivorsFailNamingRank(workers, 1, stopped);
  workers[1]->Signal(SIGCONT);
  // Awake again, it finds itself dropped: its next heartbeat or packet ends it, promptly.
  ProcessResult res = workers[1]->Wait(absl::Seconds(10));
  EXPECT_NE(res.exit_code, 0) << res.out;
  EXPECT_NE(res.exit_code, -1) << "the frozen worker hung after waking:\n" << res.out;
  EXPECT_NE(res.out.find("ABORTED"), std::string::npos) << res.out;
}

TEST(Faults, DeadAggregatorFailsTheJobWithinTheDeadline) {
  auto keep = StartDaemon();
  auto doomed = StartDaemon();
  ASSERT_NE(keep, nullptr);
  ASSERT_NE(doomed, nullptr);
  std::vector<std::unique_ptr<BackgroundProcess>> workers;
  for (int r = 0; r < kWorkers; ++r) {
    std::vector<std::string> argv = Worker(*keep, "agg-death", r);
    argv[2] = "--aggregators=" + keep->control() + "," + doomed->control();
    workers.push_back(BackgroundProcess::Start(argv));
  }
  absl::SleepFor(absl::Milliseconds(1500));
  kill(doomed->pid(), SIGKILL);
  const absl::Time killed = absl::Now();
  for (int r = 0; r < kWorkers; ++r) {
    ProcessResult res = workers[r]->Wait(absl::Seconds(20));
    EXPECT_NE(res.exit_code, 0) << res.out;
    EXPECT_NE(res.exit_code, -1) << "rank " << r << " hung:\n" << res.out;
    EXPECT_NE(res.out.find("UNAVAILABLE"), std::string::npos) << res.out;
    EXPECT_NE(res.out.find(doomed->control()), std::string::npos) << res.out;  // names the aggregator
    EXPECT_LT(absl::Now() - killed, absl::Milliseconds(kHeartbeatTimeoutMs) + absl::Seconds(4)) << "rank " << r;
  }
  doomed->Stop(absl::Seconds(1));
}

TEST(Faults, KilledAggregatorsShareMovesToTheOthersAndComesBackWithIt) {
  std::vector<std::unique_ptr<Daemon>> daemons;
  for (int i = 0; i < 3; ++i) {
    daemons.push_back(StartDaemon());
    ASSERT_NE(daemons.back(), nullptr);
  }
  const std::string aggs =
      absl::StrCat(daemons[0]->control(), ",", daemons[1]->control(), ",", daemons[2]->control());
  std::vector<std::unique_ptr<BackgroundProcess>> workers;
  for (int r = 0; r < kWorkers; ++r) {
    std::vector<std::string> argv = Worker(*daemons[0], "agg-remap", r);
    argv[2] = "--aggregators=" + aggs;
    argv.push_back("--on-aggregator-loss=remap");
    argv.push_back("--loss-bound=0");
    workers.push_back(BackgroundProcess::Start(argv));
  }
  absl::SleepFor(absl::Milliseconds(1500));
  const std::string lost = daemons[1]->control();
  kill(daemons[1]->pid(), SIGKILL);
  for (int r = 0; r < kWorkers; ++r) {
    EXPECT_TRUE(workers[r]->WaitForOutput("regrouped on 2 aggregator(s)", absl::Seconds(20)))
        << "rank " << r << ":\n" << workers[r]->Output();
    EXPECT_NE(workers[r]->Output().find("lost aggregator(s) " + lost), std::string::npos);
  }
  // Back at its address, it gets its share again.
  daemons[1]->Stop(absl::Seconds(1));
  daemons[1] = Daemon::Start(DLCPD_PATH, {absl::StrCat("--heartbeat-timeout-ms=", kHeartbeatTimeoutMs),
                                          "--port=" + lost.substr(lost.rfind(':') + 1)});
  ASSERT_NE(daemons[1], nullptr);
  for (int r = 0; r < kWorkers; ++r) {
    EXPECT_TRUE(workers[r]->WaitForOutput("regrouped on 3 aggregator(s)", absl::Seconds(20)))
        << "rank " << r << ":\n" << workers[r]->Output();
  }
  absl::SleepFor(absl::Milliseconds(500));
  for (int r = 0; r < kWorkers; ++r) {
    // Still running (a failed op would have ended it), and every round it checked was exact.
    ProcessResult res = workers[r]->Wait(absl::ZeroDuration());
    EXPECT_EQ(res.exit_code, -1) << "rank " << r << " stopped:\n" << res.out;
    EXPECT_EQ(res.out.find(", expected "), std::string::npos) << res.out;
  }
}

}  // namespace
}  // namespace dlcp::testing
