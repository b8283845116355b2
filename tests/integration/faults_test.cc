// Workers that die or freeze mid-job, and aggregators that die or are stopped (they drain), with
// real processes and real signals: the survivors must fail within the heartbeat deadline with an
// error naming the rank or aggregator, or move off it with fail-over; nothing may hang, and the
// job must run again once restarted.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "tests/common/text_files.h"
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

// All ranks on two aggregators, without fail-over, running rounds for a while.
std::vector<std::unique_ptr<BackgroundProcess>> StartJobOnTwo(const Daemon& keep, const Daemon& doomed,
                                                              const std::string& job) {
  std::vector<std::unique_ptr<BackgroundProcess>> workers;
  for (int r = 0; r < kWorkers; ++r) {
    std::vector<std::string> argv = Worker(keep, job, r);
    argv[2] = "--aggregators=" + keep.control() + "," + doomed.control();
    argv.push_back("--on-aggregator-loss=fail");  // the job is to fail, not move to `keep`
    workers.push_back(BackgroundProcess::Start(argv));
  }
  absl::SleepFor(absl::Milliseconds(1500));
  return workers;
}

void ExpectSurvivorsFailNamingRank(std::vector<std::unique_ptr<BackgroundProcess>>& workers, int dead,
                                   absl::Time since) {
  for (int r = 0; r < kWorkers; ++r) {
    if (r == dead) continue;
    ProcessResult res = workers[r]->Wait(absl::Seconds(15));
    const absl::Duration took = MonotonicNow() - since;
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
  const absl::Time killed = MonotonicNow();
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

// A worker that runs failed rounds again, whose peer has finished and left: it gives the round up
// at --retry-aborted-s, naming the setting and why the round failed, instead of retrying forever.
TEST(Faults, ARetryingWorkerWhosePeerFinishedGivesUpAtItsDeadline) {
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  auto worker = [&](int rank, std::vector<std::string> extra) {
    std::vector<std::string> argv = {DLCP_BENCH_PATH, "--plaintext", "--aggregators=" + d->control(), "--workers=2",
                                     absl::StrCat("--rank=", rank), "--job=give-up", "--tensor-bytes=100000"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return BackgroundProcess::Start(argv);
  };
  auto finishing = worker(0, {"--rounds=3", "--retry-aborted"});  // the same data every round, as its peer
  auto retrying = worker(1, {"--rounds=1000000", "--retry-aborted", "--retry-aborted-s=3"});
  EXPECT_EQ(finishing->Wait(absl::Seconds(30)).exit_code, 0);
  ASSERT_TRUE(retrying->WaitForOutput("running it again", absl::Seconds(15))) << retrying->Output();
  const absl::Time first_retry = MonotonicNow();
  ProcessResult res = retrying->Wait(absl::Seconds(30));
  EXPECT_NE(res.exit_code, 0) << res.out;
  EXPECT_NE(res.exit_code, -1) << "it retried on past its deadline:\n" << res.out;
  EXPECT_LT(MonotonicNow() - first_retry, absl::Seconds(10));
  EXPECT_NE(res.out.find("(dlcp-bench --retry-aborted-s=3)"), std::string::npos) << res.out;
  EXPECT_NE(res.out.find("worker rank 0 left the job"), std::string::npos) << res.out;
}

TEST(Faults, FrozenWorkerIsDroppedAndLearnsItWhenItWakes) {
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  auto workers = StartJob(*d, "stop-test");
  workers[1]->Signal(SIGSTOP);
  const absl::Time stopped = MonotonicNow();
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
  auto workers = StartJobOnTwo(*keep, *doomed, "agg-death");
  kill(doomed->pid(), SIGKILL);
  const absl::Time killed = MonotonicNow();
  for (int r = 0; r < kWorkers; ++r) {
    ProcessResult res = workers[r]->Wait(absl::Seconds(20));
    EXPECT_NE(res.exit_code, 0) << res.out;
    EXPECT_NE(res.exit_code, -1) << "rank " << r << " hung:\n" << res.out;
    EXPECT_NE(res.out.find("UNAVAILABLE"), std::string::npos) << res.out;
    EXPECT_NE(res.out.find(doomed->control()), std::string::npos) << res.out;  // names the aggregator
    EXPECT_LT(MonotonicNow() - killed, absl::Milliseconds(kHeartbeatTimeoutMs) + absl::Seconds(4)) << "rank " << r;
  }
  doomed->Stop(absl::Seconds(1));
}

// A deadline so long that, were an aggregator's going noticed only at it, these tests would see.
constexpr int kSlowHeartbeatTimeoutMs = 10000;

std::unique_ptr<Daemon> StartDrainingDaemon(std::vector<std::string> flags = {}) {
  flags.insert(flags.begin(), {absl::StrCat("--heartbeat-timeout-ms=", kSlowHeartbeatTimeoutMs),
                               "--job-idle-timeout-ms=30000", "--log-level=info"});
  return Daemon::Start(DLCPD_PATH, flags);
}

// Three aggregators from `start` and kWorkers workers on all of them, running rounds with the
// clients' default settings, which move an aggregator's share to the others when it goes
// (on_aggregator_loss=remap). Members in this order, so the workers go before the aggregators.
struct RemapJob {
  std::vector<std::unique_ptr<Daemon>> daemons;
  std::vector<std::unique_ptr<BackgroundProcess>> workers;
};

RemapJob StartRemapJob(const std::string& job, const std::function<std::unique_ptr<Daemon>()>& start) {
  RemapJob j;
  std::vector<std::string> controls;
  for (int i = 0; i < 3; ++i) {
    j.daemons.push_back(start());
    if (j.daemons.back() == nullptr) return j;
    controls.push_back(j.daemons.back()->control());
  }
  for (int r = 0; r < kWorkers; ++r) {
    std::vector<std::string> argv = Worker(*j.daemons[0], job, r);
    argv[2] = "--aggregators=" + absl::StrJoin(controls, ",");
    j.workers.push_back(BackgroundProcess::Start(argv));
  }
  absl::SleepFor(absl::Milliseconds(1500));
  return j;
}

// Sends `signal` to a RemapJob's second aggregator and waits for every worker to move its share
// to the other two; returns that aggregator's control address.
std::string LoseOneAggregator(RemapJob& job, int signal) {
  const std::string lost = job.daemons[1]->control();
  kill(job.daemons[1]->pid(), signal);
  for (size_t r = 0; r < job.workers.size(); ++r) {
    EXPECT_TRUE(job.workers[r]->WaitForOutput("regrouped on 2 aggregator(s)", absl::Seconds(20)))
        << "rank " << r << ":\n" << job.workers[r]->Output();
    EXPECT_NE(job.workers[r]->Output().find("lost aggregator(s) " + lost), std::string::npos);
  }
  return lost;
}

// No worker has failed or seen a wrong sum so far. They run on (ExpectRunningAndExact ends them).
void ExpectNoneFailedYet(const std::vector<std::unique_ptr<BackgroundProcess>>& workers) {
  for (size_t r = 0; r < workers.size(); ++r) {
    const std::string out = workers[r]->Output();
    EXPECT_EQ(out.find("dlcp-bench rank "), std::string::npos) << "rank " << r << " failed:\n" << out;
    EXPECT_EQ(out.find(", expected "), std::string::npos) << out;
  }
}

// Still running (a failed op would have ended them), and every round they checked was exact.
// Ends them: Wait(0) kills what still runs.
void ExpectRunningAndExact(std::vector<std::unique_ptr<BackgroundProcess>>& workers) {
  absl::SleepFor(absl::Milliseconds(500));
  ExpectNoneFailedYet(workers);  // a worker whose op failed may still be closing its client
  for (size_t r = 0; r < workers.size(); ++r) {
    ProcessResult res = workers[r]->Wait(absl::ZeroDuration());
    EXPECT_EQ(res.exit_code, -1) << "rank " << r << " stopped:\n" << res.out;
  }
}

// SIGTERM drains: each worker hears in its next heartbeat answer (within a second) that the
// aggregator is going away, and moves its share to the others, instead of noticing the silence
// at the heartbeat deadline. A rolling restart of every aggregator, one node after another as a
// DaemonSet rollout does it (the next drains as soon as the last serves again, perhaps while the
// workers are still taking it back), runs under a job with default client settings without
// failing it or a single round.
TEST(Faults, RollingRestartOfTheAggregatorsDrainsEachAndTheJobRunsOn) {
  RemapJob job = StartRemapJob("agg-drain", [] { return StartDrainingDaemon(); });
  ASSERT_EQ(job.workers.size(), static_cast<size_t>(kWorkers));
  std::vector<std::unique_ptr<Daemon>>& daemons = job.daemons;
  std::vector<std::unique_ptr<BackgroundProcess>>& workers = job.workers;
  for (size_t i = 0; i < daemons.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("restarting aggregator ", i));
    const std::string lost = daemons[i]->control();
    const absl::Time terminated = MonotonicNow();
    EXPECT_EQ(daemons[i]->Stop(absl::Seconds(10)), 0) << daemons[i]->Log();
    // Telling takes a heartbeat interval (1 s). The drain ends as each worker, once moved, probes
    // the aggregator with a join (within a quarter interval): under a second here. A worker that
    // had to put the move off (the last aggregator not taken back yet) holds it up to a
    // heartbeat interval more. With room for a sanitizer build on a loaded machine, still below
    // the 10 s deadline.
    EXPECT_LT(MonotonicNow() - terminated, absl::Seconds(8));
    // The first goes while nothing else is lost, so no worker puts the move off; later ones may
    // meet a worker still taking the last one back, and then end on its silence.
    EXPECT_NE(daemons[i]->Log().find(i == 0 ? "every worker has moved off" : "drained in"), std::string::npos)
        << daemons[i]->Log();
    for (int r = 0; r < kWorkers; ++r) {
      EXPECT_EQ(CountOccurrences(workers[r]->Output(), "lost aggregator(s) " + lost + " (UNAVAILABLE: aggregator " + lost +
                                                " is shutting down (draining))"),
                1u)
          << "rank " << r << ":\n" << workers[r]->Output();
    }
    // Back at its address (a new release, say); the next one goes at once.
    daemons[i] = StartDrainingDaemon({"--port=" + lost.substr(lost.rfind(':') + 1)});
    ASSERT_NE(daemons[i], nullptr);
  }
  // Each worker ends on all three.
  const absl::Time deadline = MonotonicNow() + absl::Seconds(20);
  for (int r = 0; r < kWorkers; ++r) {
    const auto last_layout = [&] {
      const std::string out = workers[r]->Output();
      const size_t at = out.rfind("regrouped on ");
      return at == std::string::npos ? std::string() : out.substr(at, 28);
    };
    while (last_layout() != "regrouped on 3 aggregator(s)" && MonotonicNow() < deadline) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_EQ(last_layout(), "regrouped on 3 aggregator(s)") << "rank " << r << ":\n" << workers[r]->Output();
  }
  ExpectRunningAndExact(workers);
}

// Without fail-over, the job fails as soon as the workers hear of the drain, and says why.
TEST(Faults, TerminatedAggregatorFailsItsJobAtOnceSayingWhy) {
  auto keep = StartDrainingDaemon();
  auto doomed = StartDrainingDaemon();
  ASSERT_NE(keep, nullptr);
  ASSERT_NE(doomed, nullptr);
  auto workers = StartJobOnTwo(*keep, *doomed, "agg-drain-fail");
  const absl::Time terminated = MonotonicNow();
  EXPECT_EQ(doomed->Stop(absl::Seconds(8)), 0) << doomed->Log();
  for (int r = 0; r < kWorkers; ++r) {
    ProcessResult res = workers[r]->Wait(absl::Seconds(15));
    EXPECT_NE(res.exit_code, 0) << res.out;
    EXPECT_NE(res.exit_code, -1) << "rank " << r << " hung:\n" << res.out;
    // The first to hear fails with the reason; the others may quote it from that worker's leaving.
    EXPECT_NE(res.out.find("aggregator " + doomed->control() + " is shutting down (draining)"), std::string::npos)
        << res.out;
    EXPECT_LT(MonotonicNow() - terminated, absl::Seconds(5)) << "rank " << r;
  }
}

// A worker that cannot be told (frozen) holds the drain only until its deadline, or until a
// second signal; either way dlcpd then stops, naming whom it did not tell.
TEST(Faults, DrainEndsAtItsDeadlineOrASecondSignal) {
  for (const bool second_signal : {false, true}) {
    SCOPED_TRACE(second_signal ? "second signal" : "deadline");
    auto d = StartDrainingDaemon({second_signal ? "--drain-timeout-ms=60000" : "--drain-timeout-ms=1500"});
    ASSERT_NE(d, nullptr);
    const std::string job = second_signal ? "drain-signal" : "drain-deadline";
    auto workers = StartJob(*d, job);
    kill(workers[2]->pid(), SIGSTOP);
    absl::SleepFor(absl::Milliseconds(200));
    const absl::Time terminated = MonotonicNow();
    if (second_signal) {
      kill(d->pid(), SIGTERM);
      absl::SleepFor(absl::Milliseconds(1500));  // the others told; the frozen one holds the drain
      EXPECT_EQ(d->Log().find("drained in"), std::string::npos) << d->Log();
      // Operators see it: still serving control, marked draining.
      ProcessResult status = RunProcess({DLCPCTL_PATH, "--plaintext", "--aggregators=" + d->control(), "status"},
                                        absl::Seconds(10));
      EXPECT_EQ(status.exit_code, 0) << status.out;
      EXPECT_NE(status.out.find(" draining "), std::string::npos) << status.out;
    }
    const int code = d->Stop(absl::Seconds(5));  // SIGTERM (the second one, or the first)
    EXPECT_EQ(code, 0) << d->Log();
    EXPECT_LT(MonotonicNow() - terminated, absl::Seconds(second_signal ? 6 : 4));
    const std::string log = d->Log();
    EXPECT_NE(log.find(second_signal ? "while draining: stopping now; not told: job '" + job + "' rank 2"
                                     : "drain deadline passed; not told: job '" + job + "' rank 2"),
              std::string::npos)
        << log;
    kill(workers[2]->pid(), SIGCONT);
  }
}

TEST(Faults, KilledAggregatorsShareMovesToTheOthersAndComesBackWithIt) {
  RemapJob job = StartRemapJob("agg-remap", [] { return StartDaemon(); });
  ASSERT_EQ(job.workers.size(), static_cast<size_t>(kWorkers));
  std::vector<std::unique_ptr<Daemon>>& daemons = job.daemons;
  std::vector<std::unique_ptr<BackgroundProcess>>& workers = job.workers;
  const std::string lost = LoseOneAggregator(job, SIGKILL);
  // Back at its address, it gets its share again.
  daemons[1]->Stop(absl::Seconds(1));
  daemons[1] = Daemon::Start(DLCPD_PATH, {absl::StrCat("--heartbeat-timeout-ms=", kHeartbeatTimeoutMs),
                                          "--port=" + lost.substr(lost.rfind(':') + 1)});
  ASSERT_NE(daemons[1], nullptr);
  for (int r = 0; r < kWorkers; ++r) {
    EXPECT_TRUE(workers[r]->WaitForOutput("regrouped on 3 aggregator(s)", absl::Seconds(20)))
        << "rank " << r << ":\n" << workers[r]->Output();
  }
  ExpectRunningAndExact(workers);
}

// An aggregator that crashes and is back at once, at the same address (a container restarted as
// soon as it died), knows nothing of the job. Its share moves to the others, and it is taken back,
// however soon it came back: 0.5 s (before any worker noticed it gone) to 8 s (after every
// worker moved its share). The job runs on.
class AggregatorBackAfter : public ::testing::TestWithParam<int> {};
constexpr int kBackHeartbeatTimeoutMs = 4000;  // 2 and 3 s: back before any worker's deadline

TEST_P(AggregatorBackAfter, ItIsTakenBackAndTheJobRunsOn) {
  const std::string name = absl::StrCat("agg-back-", GetParam());
  const auto start = [] {
    return Daemon::Start(DLCPD_PATH, {absl::StrCat("--heartbeat-timeout-ms=", kBackHeartbeatTimeoutMs),
                                      "--job-idle-timeout-ms=10000"});
  };
  RemapJob job = StartRemapJob(name, start);
  ASSERT_EQ(job.workers.size(), static_cast<size_t>(kWorkers));
  std::vector<std::unique_ptr<Daemon>>& daemons = job.daemons;
  const std::string lost = daemons[1]->control();
  kill(daemons[1]->pid(), SIGKILL);
  daemons[1]->Stop(absl::Seconds(1));
  absl::SleepFor(absl::Milliseconds(GetParam()));
  daemons[1] = Daemon::Start(DLCPD_PATH, {absl::StrCat("--heartbeat-timeout-ms=", kBackHeartbeatTimeoutMs),
                                          "--job-idle-timeout-ms=10000", "--port=" + lost.substr(lost.rfind(':') + 1)});
  ASSERT_NE(daemons[1], nullptr);
  for (int r = 0; r < kWorkers; ++r) {
    EXPECT_TRUE(job.workers[r]->WaitForOutput("regrouped on 3 aggregator(s)", absl::Seconds(30)))
        << "rank " << r << ":\n" << job.workers[r]->Output();
  }
  ExpectRunningAndExact(job.workers);
}

INSTANTIATE_TEST_SUITE_P(Faults, AggregatorBackAfter, ::testing::Values(500, 2000, 3000, 5000, 8000),
                         [](const auto& info) { return absl::StrCat(info.param, "ms"); });

// A frozen aggregator (SIGSTOP; as a node that went away without resetting its connections)
// answers nothing: every call to it runs to its deadline. Its share moves to the others, and
// while the workers probe it, their heartbeats to the others must go on, or those drop them.
TEST(Faults, FrozenAggregatorsShareMovesToTheOthersAndTheJobRunsOn) {
  RemapJob job = StartRemapJob("agg-frozen", [] { return StartDaemon(); });
  ASSERT_EQ(job.workers.size(), static_cast<size_t>(kWorkers));
  LoseOneAggregator(job, SIGSTOP);
  // A probe of the frozen one that ran to the control-call deadline (5 s) would outlast the
  // others' heartbeat deadline (1.5 s). Long enough for several probes:
  absl::SleepFor(absl::Seconds(12));
  ExpectRunningAndExact(job.workers);
  kill(job.daemons[1]->pid(), SIGCONT);
}

// The wall clock steps under a running job (NTP or chrony stepping it, a VM resumed, `date -s`),
// on the aggregator and every worker at once: libfaketime moves it, and the monotonic clock runs
// on. dlcp measures every deadline on the monotonic clock. So a step forward fails nothing, and a
// worker that dies as the clock steps back is still found at the heartbeat deadline. On
// wall-clock time, the step forward made every heartbeat look two minutes old, and after the step
// back the dead worker's last heartbeat lay four minutes in the future.
TEST(Faults, StepsOfTheWallClockFailNothing) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's runtime must be the first library loaded, so libfaketime cannot be "
                  "preloaded into this build's binaries; the plain build (make test) runs this";
#endif
  constexpr char kFaketime[] = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
  if (access(kFaketime, R_OK) != 0) {
    GTEST_SKIP() << kFaketime << " is missing; scripts/install-deps.sh installs libfaketime";
  }
  char dir[] = "/tmp/dlcp-clock-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string offset = std::string(dir) + "/offset";
  // Written aside and renamed into place: libfaketime reads the file at every clock call, and
  // must never see it empty.
  const auto step = [&](const std::string& to) {
    std::ofstream(offset + ".new") << to << "\n";
    std::filesystem::rename(offset + ".new", offset);
  };
  step("+0");
  const std::vector<std::string> env = {absl::StrCat("LD_PRELOAD=", kFaketime), "FAKETIME_TIMESTAMP_FILE=" + offset,
                                        "FAKETIME_NO_CACHE=1", "DONT_FAKE_MONOTONIC=1"};
  auto d = Daemon::Start(DLCPD_PATH, {absl::StrCat("--heartbeat-timeout-ms=", kHeartbeatTimeoutMs)}, env);
  ASSERT_NE(d, nullptr);
  std::vector<std::unique_ptr<BackgroundProcess>> workers;
  for (int r = 0; r < kWorkers; ++r) {
    workers.push_back(BackgroundProcess::Start(WithEnvironment(env, Worker(*d, "clock-steps", r))));
  }
  absl::SleepFor(absl::Milliseconds(1500));
  step("+120");
  absl::SleepFor(absl::Milliseconds(2 * kHeartbeatTimeoutMs));
  ExpectNoneFailedYet(workers);
  workers[2]->Signal(SIGKILL);
  const absl::Time killed = MonotonicNow();
  step("-120");
  ExpectSurvivorsFailNamingRank(workers, 2, killed);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace dlcp::testing
