// Host stages (docs/host-stage.md) with the real binaries: dlcp-bench workers that share a host
// sum in the shared memory their dlcpd hands out, and one of them per host pushes. Results must
// be exact, hosts must push once, and a worker that dies or a stage that cannot be had must be
// named or fallen back from, never waited on.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "common/shm/host_hello.h"
#include "tests/common/text_files.h"
#include "tests/integration/process_harness.h"

namespace dlcp::testing {
namespace {

std::vector<std::string> Bench(const std::string& aggregators, int workers, const std::string& job,
                               const std::string& host_socket, int tensor_bytes, int rounds) {
  return {DLCP_BENCH_PATH,
          "--plaintext",
          "--aggregators=" + aggregators,
          absl::StrCat("--workers=", workers),
          "--job=" + job,
          "--host-socket=" + host_socket,
          absl::StrCat("--tensor-bytes=", tensor_bytes),
          absl::StrCat("--rounds=", rounds),
          "--timeout-s=100"};
}

double Metric(const Daemon& d, const std::string& name) {
  return Scraped(HttpGet(d.metrics_port(), "/metrics", absl::Seconds(5)), name);
}

struct Shape {
  int workers;
  int tensor_bytes;
  int tensors = 1;  // submitted at once: an op's steps overlap the one before's
};

class OneHost : public ::testing::TestWithParam<Shape> {};

// The stage holds the whole job: its sum is the result, and nothing crosses the network.
// 64 KiB slots make the larger tensors go through in several steps.
TEST_P(OneHost, WorkersSumInTheirHostStageExactly) {
  const Shape s = GetParam();
  auto d = Daemon::Start(DLCPD_PATH, {"--metrics-port=0", "--host-slot-bytes=65536"});
  ASSERT_NE(d, nullptr);
  std::vector<std::string> argv = Bench(d->control(), s.workers, "one-host", d->host_socket(), s.tensor_bytes, 6);
  argv.push_back(absl::StrCat("--tensors=", s.tensors));
  ProcessResult r = RunProcess(argv, absl::Seconds(110));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("results exact: yes"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("no host stage"), std::string::npos) << r.out;
  EXPECT_EQ(Metric(*d, "dlcp_host_stages_formed_total"), 1);
  EXPECT_EQ(Metric(*d, "dlcp_rx_bytes_total"), 0) << "a stage of the whole job pushed data";
}

INSTANTIATE_TEST_SUITE_P(WorkersAndSizes, OneHost,
                         ::testing::Values(Shape{2, 1000}, Shape{3, 300000}, Shape{4, 4000000}, Shape{3, 300000, 5}),
                         [](const auto& info) {
                           return absl::StrCat(info.param.workers, "Workers", info.param.tensors, "x",
                                               info.param.tensor_bytes, "Bytes");
                         });

// Ranks 0 and 1 share host A's stage, ranks 2 and 3 host B's (a dlcpd each, both aggregators).
std::unique_ptr<BackgroundProcess> StartOnTwoHosts(const Daemon& a, const Daemon& b, const std::string& job,
                                                   const std::vector<std::string>& extra, int rounds, int rank) {
  const Daemon& host = rank < 2 ? a : b;
  std::vector<std::string> argv = Bench(a.control() + "," + b.control(), 4, job, host.host_socket(), 2000000, rounds);
  argv.push_back(absl::StrCat("--rank=", rank));
  argv.push_back("--local-size=2");
  argv.insert(argv.end(), extra.begin(), extra.end());
  return BackgroundProcess::Start(argv);
}

std::vector<std::unique_ptr<BackgroundProcess>> StartTwoHosts(const Daemon& a, const Daemon& b, const std::string& job,
                                                              const std::vector<std::string>& extra, int rounds) {
  std::vector<std::unique_ptr<BackgroundProcess>> workers;
  for (int rank = 0; rank < 4; ++rank) workers.push_back(StartOnTwoHosts(a, b, job, extra, rounds, rank));
  return workers;
}

double ReceivedBytes(const Daemon& a, const Daemon& b) {
  return Metric(a, "dlcp_rx_bytes_total") + Metric(b, "dlcp_rx_bytes_total");
}

// The same job of two hosts of two on two dlcpd, with host stages and without (`extra` flags for
// dlcp-bench, `daemon` for dlcpd; `check` reads each rank's output and returns what it counts).
// Expects each host to push about half the bytes with stages, and no rejects. Returns the counts
// added up per way.
std::array<double, 2> WithAndWithoutStages(const std::string& job, const std::vector<std::string>& extra,
                                           const std::function<double(int rank, const std::string& out)>& check,
                                           std::vector<std::string> daemon = {}) {
  daemon.push_back("--metrics-port=0");
  auto a = Daemon::Start(DLCPD_PATH, daemon);
  auto b = Daemon::Start(DLCPD_PATH, daemon);
  if (a == nullptr || b == nullptr) {
    ADD_FAILURE() << "dlcpd did not start";
    return {};
  }
  double received[2];
  std::array<double, 2> counted = {0, 0};
  for (bool stage : {true, false}) {
    const double before = ReceivedBytes(*a, *b);
    std::vector<std::string> flags = extra;
    flags.push_back(absl::StrCat("--host-stage=", stage));
    auto workers = StartTwoHosts(*a, *b, absl::StrCat(job, stage ? "" : "-no-stages"), flags, 8);
    for (int rank = 0; rank < 4; ++rank) {
      ProcessResult r = workers[rank]->Wait(absl::Seconds(60));
      EXPECT_EQ(r.exit_code, 0) << "rank " << rank << ":\n" << r.out;
      counted[stage] += check(rank, r.out);
    }
    received[stage] = ReceivedBytes(*a, *b) - before;
  }
  // Two pushes of each chunk instead of four; repairs and requests add a little.
  EXPECT_LT(received[true], 0.6 * received[false]) << received[true] << " against " << received[false];
  EXPECT_EQ(Metric(*a, "dlcp_rejects_total") + Metric(*b, "dlcp_rejects_total"), 0);
  return counted;
}

// A bounded run of dlcp-bench by `rank`: its results exact over their contributors, no bound
// violated, and no round's loss over `most`. Returns its JSON line ("" if it printed none).
std::string BoundHeld(int rank, const std::string& out, double most) {
  const size_t at = out.rfind("{\"rank\"");
  if (at == std::string::npos) {
    ADD_FAILURE() << "rank " << rank << " printed no JSON:\n" << out;
    return "";
  }
  const std::string json = out.substr(at);
  EXPECT_NE(json.find("\"exact\":true,\"checked\":true"), std::string::npos) << json;
  EXPECT_EQ(NumberAfter(json, "bound_violations"), 0) << json;
  EXPECT_LE(NumberAfter(json, "max_round_loss"), most) << json;
  return json;
}

// Three tensors at once: the first worker's network legs of different keys run side by side.
TEST(HostStage, EachHostPushesOnceAndEveryWorkerGetsTheExactSum) {
  WithAndWithoutStages("two-hosts", {"--tensors=3"}, [](int rank, const std::string& out) {
    EXPECT_NE(out.find("\"exact\":true"), std::string::npos) << out;
    EXPECT_NE(out.find("\"min_contributors\":4"), std::string::npos) << out;
    return 0.0;
  });
}

// Under a loss bound, with drops injected, each host's stage still pushes its sum once: its
// first worker declares the sum's classes for the whole stage, a lost push is that many
// (worker, chunk) contributions, and the bound holds on them. Every worker's results are exact
// sums over the contributions they hold (dlcp-bench reads each chunk's contributors off its
// digits), and every worker reports the round's losses. 256 KiB slots: each op goes through in 8
// steps, each a bounded round of its own, with its own error feedback.
TEST(HostStage, BoundedLossGoesThroughTheStagesAndTheBoundHolds) {
  const std::array<double, 2> left_out = WithAndWithoutStages(
      "bounded", {"--loss-bound=0.05", "--json", "--inject-drop-class=1:0.05,2:0.05,3:0.05"},
      [](int rank, const std::string& out) {
        const std::string json = BoundHeld(rank, out, 0.05);
        return NumberAfter(json, "left_out_c1") + NumberAfter(json, "left_out_c2") + NumberAfter(json, "left_out_c3");
      },
      {"--host-slot-bytes=262144"});
  EXPECT_GT(left_out[true], 0) << "nothing was left out through the stages: the injected drops were all repaired";
}

// Phase-aware tolerance through the stages: the first worker's engine sets the round's ε from the
// norm of the host's sum (raised outside critical phases) and declares it in the round's manifest.
// The bound holds on it, and every result is exact over its contributors.
TEST(HostStage, PhaseAwareBoundsGoThroughTheStagesToo) {
  WithAndWithoutStages(
      "phase-aware", {"--loss-bound=0.02", "--phase-aware", "--json", "--inject-drop-class=1:0.05,2:0.05,3:0.05"},
      [](int rank, const std::string& out) {
        BoundHeld(rank, out, 0.04);  // relaxed: 2 x ε at most
        return 0.0;
      });
}

// Host A's workers share a stage, host B's push their own (a host that fell back, or had its
// stage turned off): an op larger than a slot still goes to the aggregators as one round of the
// whole tensor from A, as from B, so the two agree. 64 KiB slots: each 300 kB tensor takes five
// steps; three at once, reliable and under a loss bound with drops injected.
class MixedHosts : public ::testing::TestWithParam<double> {};

TEST_P(MixedHosts, AHostWithAStageAndOneWithoutSumOpsLargerThanASlot) {
  const double bound = GetParam();
  auto a = Daemon::Start(DLCPD_PATH, {"--metrics-port=0", "--host-slot-bytes=65536"});
  auto b = Daemon::Start(DLCPD_PATH, {"--metrics-port=0", "--host-slot-bytes=65536"});
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  std::vector<std::unique_ptr<BackgroundProcess>> workers;
  for (int rank = 0; rank < 4; ++rank) {
    std::vector<std::string> argv = Bench(a->control() + "," + b->control(), 4, "mixed", (rank < 2 ? a : b)->host_socket(),
                                          300000, 6);
    argv.insert(argv.end(), {absl::StrCat("--rank=", rank), "--local-size=2", "--tensors=3", "--json",
                             absl::StrCat("--loss-bound=", bound), absl::StrCat("--host-stage=", rank < 2)});
    if (bound > 0) argv.push_back("--inject-drop-class=1:0.05,2:0.05,3:0.05");
    workers.push_back(BackgroundProcess::Start(argv));
  }
  for (int rank = 0; rank < 4; ++rank) {
    ProcessResult r = workers[rank]->Wait(absl::Seconds(60));
    EXPECT_EQ(r.exit_code, 0) << "rank " << rank << ":\n" << r.out;
    BoundHeld(rank, r.out, bound);
  }
  EXPECT_EQ(Metric(*a, "dlcp_host_stages_formed_total"), 1);
  EXPECT_EQ(Metric(*b, "dlcp_host_stages_formed_total"), 0);
}

INSTANTIATE_TEST_SUITE_P(ReliableAndBounded, MixedHosts, ::testing::Values(0.0, 0.05),
                         [](const auto& info) { return info.param > 0 ? "Bounded" : "Reliable"; });

// The first worker of a stage with a network leg starts an op's one round with the op's first
// step, and pushes each part of the host's sum as soon as it is summed: in some op, its first push
// leaves before the last step's parts are all in (on its timeline, the network leg's "first push"
// before the stage op's last "gathered"). 64 KiB slots: a 2 MB tensor goes in 31 steps.
TEST(HostStage, AnOpLargerThanASlotPushesEachPartAsSoonAsItIsSummed) {
  char dir[] = "/tmp/dlcp-overlap-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  auto a = Daemon::Start(DLCPD_PATH, {"--metrics-port=0", "--host-slot-bytes=65536"});
  auto b = Daemon::Start(DLCPD_PATH, {"--metrics-port=0", "--host-slot-bytes=65536"});
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const std::vector<std::string> extra = {absl::StrCat("--timeline=", dir, "/t-%r.json")};
  auto workers = StartTwoHosts(*a, *b, "overlap", extra, 8);
  for (int rank = 0; rank < 4; ++rank) {
    ProcessResult r = workers[rank]->Wait(absl::Seconds(60));
    EXPECT_EQ(r.exit_code, 0) << "rank " << rank << ":\n" << r.out;
    EXPECT_NE(r.out.find("\"exact\":true"), std::string::npos) << r.out;
  }
  EXPECT_EQ(Metric(*a, "dlcp_host_stages_formed_total"), 1);
  // Per round: when the leg's first push left, and when the stage's last step was gathered (the
  // stage op's span id is the engine's with bit 31 set).
  std::map<uint64_t, int64_t> first_push, last_gathered;
  const std::string trace = ReadFile(absl::StrCat(dir, "/t-0.json"));
  for (absl::string_view line : absl::StrSplit(trace, '\n')) {
    const bool push = absl::StrContains(line, "\"name\":\"first push\"");
    if (!push && !absl::StrContains(line, "\"name\":\"gathered\"")) continue;
    const size_t id_at = line.find("\"id\":\"0x");
    uint64_t id = 0;
    ASSERT_NE(id_at, absl::string_view::npos) << line;
    ASSERT_TRUE(absl::SimpleHexAtoi(line.substr(id_at + 8, line.find('"', id_at + 8) - id_at - 8), &id)) << line;
    const auto ts = static_cast<int64_t>(NumberAfter(std::string(line), "ts"));
    if (push) first_push[id | (uint64_t{1} << 31)] = ts;
    if (!push) last_gathered[id] = std::max(last_gathered[id], ts);
  }
  int overlapped = 0;
  for (const auto& [id, pushed] : first_push) overlapped += last_gathered.count(id) && pushed < last_gathered[id];
  EXPECT_GE(first_push.size(), 8u) << trace.substr(0, 3000);
  EXPECT_GT(overlapped, 0) << "no op pushed before its sum was done:\n" << trace.substr(0, 3000);
  (void)system(absl::StrCat("rm -rf '", dir, "'").c_str());
}

// The stage of ranks 2 and 3 loses rank 3: rank 2 learns it from its dlcpd at once, ranks 0 and
// 1 from the aggregators, which miss its heartbeats (1.5 s here) or hear rank 2 leave over it.
TEST(HostStage, KilledWorkerIsNamedOnItsHostAtOnceAndByTheOthersWithinTheDeadline) {
  auto a = Daemon::Start(DLCPD_PATH, {"--heartbeat-timeout-ms=1500", "--metrics-port=0"});
  auto b = Daemon::Start(DLCPD_PATH, {"--heartbeat-timeout-ms=1500", "--metrics-port=0"});
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto workers = StartTwoHosts(*a, *b, "kill-in-stage", {"--on-aggregator-loss=fail"}, 1000000);
  const absl::Time give_up = MonotonicNow() + absl::Seconds(30);
  while (Metric(*a, "dlcp_rounds_total") < 20 && MonotonicNow() < give_up) absl::SleepFor(absl::Milliseconds(50));
  ASSERT_GE(Metric(*a, "dlcp_rounds_total"), 20) << workers[0]->Output();
  workers[3]->Signal(SIGKILL);
  const absl::Time killed = MonotonicNow();
  for (int rank = 0; rank < 3; ++rank) {
    ProcessResult r = workers[rank]->Wait(absl::Seconds(15));
    const absl::Duration took = MonotonicNow() - killed;
    EXPECT_NE(r.exit_code, 0) << "rank " << rank << " did not fail:\n" << r.out;
    EXPECT_NE(r.exit_code, -1) << "rank " << rank << " hung:\n" << r.out;
    EXPECT_NE(r.out.find("worker rank 3"), std::string::npos) << "rank " << rank << ":\n" << r.out;
    EXPECT_LT(took, absl::Seconds(rank == 2 ? 1 : 3)) << "rank " << rank << ":\n" << r.out;
  }
}

// A worker of a stage that dies and is restarted alone (its pod, say): its stage-mate fails its
// op naming it and pushes its own data from then on; the restarted worker cannot join the stage
// the mate still holds, and pushes its own too; and the job goes on from round 0 once every rank
// is back, exact, without anyone else restarting.
// The rank comes back later than dlcpd's gather timeout after the others asked for the stage's
// next form on standby: their request has no deadline, and the timeout counts from the rank's own.
TEST(HostStage, AWorkerRestartedAloneRejoinsTheJobAndItsHostStageFormsAgain) {
  const std::vector<std::string> daemon = {"--heartbeat-timeout-ms=1500", "--metrics-port=0",
                                           "--host-gather-timeout-ms=1000"};
  auto a = Daemon::Start(DLCPD_PATH, daemon);
  auto b = Daemon::Start(DLCPD_PATH, daemon);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  // A trainer that runs a step again; its log says which stage it has.
  const std::vector<std::string> retry = {"--retry-aborted", "--loss-bound=0", "--log-level=info"};
  auto workers = StartTwoHosts(*a, *b, "restart-one", retry, 1000000);
  const absl::Time give_up = MonotonicNow() + absl::Seconds(30);
  while (Metric(*a, "dlcp_rounds_total") < 20 && MonotonicNow() < give_up) absl::SleepFor(absl::Milliseconds(50));
  ASSERT_GE(Metric(*a, "dlcp_rounds_total"), 20) << workers[0]->Output();
  ASSERT_EQ(Metric(*b, "dlcp_host_stages_formed_total"), 1) << workers[2]->Output();
  workers[3]->Signal(SIGKILL);
  workers[3]->Wait(absl::Seconds(5));
  const absl::Time killed = MonotonicNow();
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(workers[rank]->WaitForOutput("running it again", absl::Seconds(15))) << workers[rank]->Output();
    EXPECT_TRUE(workers[rank]->WaitForOutput("worker rank 3", absl::Seconds(5))) << workers[rank]->Output();
  }
  EXPECT_NE(workers[2]->Output().find("its host stage lost a worker"), std::string::npos) << workers[2]->Output();
  absl::SleepFor(killed + absl::Milliseconds(1200) - MonotonicNow());  // past the gather timeout
  // Rank 2 waits on standby for its stage to form again, and rank 3, restarted, forms it.
  const double received_before = ReceivedBytes(*a, *b);
  constexpr int kRounds = 30;
  auto restarted = StartOnTwoHosts(*a, *b, "restart-one", retry, kRounds, 3);
  ProcessResult res = restarted->Wait(absl::Seconds(60));
  const double received = ReceivedBytes(*a, *b) - received_before;
  EXPECT_EQ(res.exit_code, 0) << res.out << "\nranks 0-2 meanwhile:\n"
                              << workers[0]->Output() << workers[1]->Output() << workers[2]->Output();
  EXPECT_NE(res.out.find("\"exact\":true"), std::string::npos) << res.out;
  EXPECT_NE(res.out.find("host stage with ranks 2,3"), std::string::npos) << res.out;
  EXPECT_TRUE(workers[2]->WaitForOutput("host stage formed again with ranks 2,3", absl::Seconds(5)))
      << workers[2]->Output();
  EXPECT_EQ(Metric(*b, "dlcp_host_stages_formed_total"), 2);
  // Each host pushed once per round again: two tensors a round reached the aggregators, not three.
  EXPECT_LT(received / (kRounds * 2000000.0), 2.5) << received << " bytes received over " << kRounds << " rounds";
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(workers[rank]->WaitForOutput("is back; it goes on from round 0", absl::Seconds(5)))
        << workers[rank]->Output();
    ProcessResult s = workers[rank]->Wait(absl::ZeroDuration());
    EXPECT_EQ(s.exit_code, -1) << "rank " << rank << " stopped:\n" << s.out;  // it retries, never gives up
    EXPECT_EQ(s.out.find(", expected "), std::string::npos) << s.out;
  }
}

// A frozen worker's process lives on, so dlcpd does not see it go: the aggregator misses its
// heartbeats and fails the job, and the others' stage ops, which wait on no aggregator round (the
// stage holds the whole job), end at the next heartbeat answer, naming it, not at their deadline.
TEST(HostStage, AFrozenWorkerOfAWholeJobStageIsNamedWithinTheHeartbeatDeadline) {
  auto d = Daemon::Start(DLCPD_PATH, {"--heartbeat-timeout-ms=1500", "--metrics-port=0"});
  ASSERT_NE(d, nullptr);
  std::vector<std::unique_ptr<BackgroundProcess>> workers;
  for (int rank = 0; rank < 3; ++rank) {
    std::vector<std::string> argv = Bench(d->control(), 3, "frozen", d->host_socket(), 400000, 1000000);
    argv.push_back(absl::StrCat("--rank=", rank));
    argv.push_back("--local-size=3");
    argv.push_back("--op-timeout-ms=60000");
    workers.push_back(BackgroundProcess::Start(argv));
  }
  // Every rank in its stage and joined (a rank frozen before it joins is missed by no heartbeat).
  const absl::Time give_up = MonotonicNow() + absl::Seconds(30);
  while ((Metric(*d, "dlcp_host_stages_formed_total") < 1 || Metric(*d, "dlcp_workers") < 3) &&
         MonotonicNow() < give_up) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(Metric(*d, "dlcp_workers"), 3) << workers[0]->Output();
  workers[2]->Signal(SIGSTOP);
  const absl::Time stopped = MonotonicNow();
  for (int rank = 0; rank < 2; ++rank) {
    ProcessResult r = workers[rank]->Wait(absl::Seconds(15));
    EXPECT_NE(r.exit_code, 0) << "rank " << rank << " did not fail:\n" << r.out;
    EXPECT_NE(r.exit_code, -1) << "rank " << rank << " hung:\n" << r.out;
    EXPECT_NE(r.out.find("worker rank 2"), std::string::npos) << "rank " << rank << ":\n" << r.out;
    EXPECT_LT(MonotonicNow() - stopped, absl::Milliseconds(1500) + absl::Seconds(3)) << "rank " << rank;
  }
  workers[2]->Signal(SIGCONT);
}

// Host B's dlcpd, its stage's broker and one of the job's two aggregators, is killed: the stage
// needs it no more (its workers hold the region), and its share of the job moves to A's dlcpd.
class KilledDlcpd : public ::testing::TestWithParam<int> {};

TEST_P(KilledDlcpd, MovesItsShareToTheOtherAndTheStagesRunOn) {
  std::vector<std::string> flags = {"--heartbeat-timeout-ms=1500", "--metrics-port=0"};
  if (GetParam() > 0) flags.push_back(absl::StrCat("--host-slot-bytes=", GetParam()));
  auto a = Daemon::Start(DLCPD_PATH, flags);
  auto b = Daemon::Start(DLCPD_PATH, flags);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto workers = StartTwoHosts(*a, *b, "kill-dlcpd", {}, 400);
  const absl::Time give_up = MonotonicNow() + absl::Seconds(30);
  while (Metric(*b, "dlcp_rounds_total") < 20 && MonotonicNow() < give_up) absl::SleepFor(absl::Milliseconds(50));
  ASSERT_GE(Metric(*b, "dlcp_rounds_total"), 20) << workers[0]->Output();
  ASSERT_EQ(::kill(b->pid(), SIGKILL), 0);
  for (int rank = 0; rank < 4; ++rank) {
    ProcessResult r = workers[rank]->Wait(absl::Seconds(60));
    EXPECT_EQ(r.exit_code, 0) << "rank " << rank << ":\n" << r.out;
    EXPECT_NE(r.out.find("\"exact\":true"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("regrouped on 1 aggregator"), std::string::npos) << r.out;
  }
}

// Default slots: each op is one step. 64 KiB slots: each goes in 31, and the first worker's round
// pushes each part as it is summed, keeping it for the regroup as it goes.
INSTANTIATE_TEST_SUITE_P(OneStepAndManySteps, KilledDlcpd, ::testing::Values(0, 65536),
                         [](const auto& info) { return info.param > 0 ? "ManySteps" : "OneStep"; });

TEST(HostStage, WithoutAStageEveryWorkerPushesItsOwnAndSaysWhyOnce) {
  auto d = Daemon::Start(DLCPD_PATH, {"--metrics-port=0"});
  ASSERT_NE(d, nullptr);
  ProcessResult r = RunProcess(Bench(d->control(), 2, "no-dlcpd-socket", "/nonexistent/dlcpd.sock", 100000, 5),
                               absl::Seconds(110));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("results exact: yes"), std::string::npos) << r.out;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string line = absl::StrCat("rank ", rank, " of job 'no-dlcpd-socket': no host stage");
    const size_t at = r.out.find(line);
    EXPECT_NE(at, std::string::npos) << r.out;
    EXPECT_EQ(r.out.find(line, at + 1), std::string::npos) << "said more than once:\n" << r.out;
  }
  EXPECT_NE(r.out.find("no dlcpd serves host_socket /nonexistent/dlcpd.sock"), std::string::npos) << r.out;
  EXPECT_GT(Metric(*d, "dlcp_rx_bytes_total"), 0);
}

// `argv` run as uid 65534, through setpriv.
std::vector<std::string> AsNobody(std::vector<std::string> argv) {
  std::vector<std::string> out = {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

// Why this test cannot run programs as uid 65534 (it then skips); none where it can.
std::optional<std::string> CannotRunAsNobody() {
  if (::geteuid() != 0 || ::access("/usr/bin/setpriv", X_OK) != 0) return "needs root and setpriv";
  std::vector<std::string> probe = AsNobody({DLCP_BENCH_PATH, "--version"});
  if (RunProcess(probe, absl::Seconds(10)).exit_code != 0) {
    return absl::StrCat("uid 65534 cannot run ", DLCP_BENCH_PATH, " (a build tree it cannot reach)");
  }
  return std::nullopt;
}

// Only the job's own processes reach its stage: a stage is its workers' uid's (SO_PEERCRED), and
// workers of one job under two uids never share one. Both push their own, and the log says why.
TEST(HostStage, WorkersOfTwoUsersNeverShareAStageAndTheRefusalSaysWhy) {
  if (auto why = CannotRunAsNobody()) GTEST_SKIP() << *why;
  auto d = Daemon::Start(DLCPD_PATH, {"--host-gather-timeout-ms=1000"});
  ASSERT_NE(d, nullptr);
  const std::string dir = d->host_socket().substr(0, d->host_socket().rfind('/'));
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);  // the other user may reach the socket; dlcpd decides
  std::vector<std::unique_ptr<BackgroundProcess>> workers;
  for (int rank = 0; rank < 2; ++rank) {
    std::vector<std::string> argv = Bench(d->control(), 2, "two-users", d->host_socket(), 100000, 5);
    argv.push_back(absl::StrCat("--rank=", rank));
    argv.push_back("--local-size=2");
    workers.push_back(BackgroundProcess::Start(rank == 1 ? AsNobody(argv) : argv));
  }
  std::string both;
  for (auto& w : workers) {
    ProcessResult r = w->Wait(absl::Seconds(60));
    EXPECT_EQ(r.exit_code, 0) << r.out;
    EXPECT_NE(r.out.find("\"exact\":true"), std::string::npos) << r.out;
    both += r.out;
  }
  EXPECT_NE(both.find("a job's workers on one host must run as one user"), std::string::npos) << both;
  EXPECT_NE(both.find("of uid 65534"), std::string::npos) << both;
}

// A local stranger (uid 65534) asks first for a stage of a job's name, and holds its request until
// its gather times out: the job's own workers (root) still get their stage, then and after.
TEST(HostStage, AStrangersHelloForAJobsNameNeitherTakesNorBlocksItsStage) {
  if (auto why = CannotRunAsNobody()) GTEST_SKIP() << *why;
  auto d = Daemon::Start(DLCPD_PATH, {"--metrics-port=0", "--host-gather-timeout-ms=2000"});
  ASSERT_NE(d, nullptr);
  const std::string dir = d->host_socket().substr(0, d->host_socket().rfind('/'));
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  std::string hex;
  for (uint8_t b : EncodeHostHello(HostHello{"victim", 2, 0, 2, false})) absl::StrAppendFormat(&hex, "%02x", b);
  auto stranger = BackgroundProcess::Start(AsNobody(
      {"/usr/bin/python3", "-c",
       absl::StrCat("import socket, sys, time\n"
                    "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
                    "s.connect(sys.argv[1]); s.send(bytes.fromhex('", hex, "')); print('sent', flush=True)\n"
                    "print('answer', len(s.recv(4096)), flush=True)\n"),
       d->host_socket()}));
  ASSERT_TRUE(stranger->WaitForOutput("sent", absl::Seconds(10))) << stranger->Output();
  auto run_job = [&] {
    std::vector<std::unique_ptr<BackgroundProcess>> workers;
    for (int rank = 0; rank < 2; ++rank) {
      std::vector<std::string> argv = Bench(d->control(), 2, "victim", d->host_socket(), 100000, 5);
      argv.push_back(absl::StrCat("--rank=", rank));
      argv.push_back("--local-size=2");
      workers.push_back(BackgroundProcess::Start(argv));
    }
    for (auto& w : workers) {
      ProcessResult r = w->Wait(absl::Seconds(60));
      EXPECT_EQ(r.exit_code, 0) << r.out;
      EXPECT_NE(r.out.find("\"exact\":true"), std::string::npos) << r.out;
      EXPECT_NE(r.out.find("\"host_stage_size\":2"), std::string::npos) << "no stage:\n" << r.out;
    }
  };
  run_job();
  // The stranger's own gather timed out and was refused; the job's name is not refused for it.
  ProcessResult s = stranger->Wait(absl::Seconds(30));
  EXPECT_NE(s.out.find("answer"), std::string::npos) << s.out;
  run_job();
  EXPECT_EQ(Metric(*d, "dlcp_host_stages_formed_total"), 2);
}

TEST(HostStage, AStageOverTheHostsSharedMemoryBoundIsRefusedNamingTheSetting) {
  // Room for a stage of two workers (64 KiB + (2 + 8) x 1 MiB), not of four.
  auto d = Daemon::Start(DLCPD_PATH, {"--host-shm-bytes=11534336", "--host-slot-bytes=1048576"});
  ASSERT_NE(d, nullptr);
  ProcessResult r = RunProcess(Bench(d->control(), 4, "over-budget", d->host_socket(), 100000, 5), absl::Seconds(110));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("results exact: yes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("no host stage"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dlcpd --host-shm-bytes=11534336"), std::string::npos) << r.out;
}

// A stage that would not fit with --host-slot-bytes slots (a host of many workers) gets smaller
// ones that fit, down to a MiB, rather than no stage: its ops go in more steps.
TEST(HostStage, AStageThatDoesNotFitWithFullSlotsGetsSmallerOnes) {
  // Full slots: 64 KiB + (4 + 8) x 4 MiB, over the 20 MiB. Slots of 1.6 MiB fit.
  auto d = Daemon::Start(DLCPD_PATH, {"--metrics-port=0", "--host-shm-bytes=20971520", "--host-slot-bytes=4194304"});
  ASSERT_NE(d, nullptr);
  auto bench = BackgroundProcess::Start(Bench(d->control(), 4, "small-slots", d->host_socket(), 8000000, 5));
  for (const absl::Time end = MonotonicNow() + absl::Seconds(30);
       Metric(*d, "dlcp_host_shm_bytes") == 0 && MonotonicNow() < end;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  const double held = Metric(*d, "dlcp_host_shm_bytes");
  EXPECT_GT(held, 0);
  EXPECT_LE(held, 20971520);
  ProcessResult r = bench->Wait(absl::Seconds(100));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("results exact: yes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"staged_workers\":4"), std::string::npos) << r.out;
  EXPECT_EQ(Metric(*d, "dlcp_host_stages_formed_total"), 1);
}

}  // namespace
}  // namespace dlcp::testing
