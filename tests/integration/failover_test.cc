// Aggregator fail-over (ClientOptions::AggregatorLoss::kRemap) in one process: real clients, real
// gRPC and data planes. A worker that had not finished a round when an aggregator died finishes it
// in the new layout, exactly, because the workers that had finished it push it again.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/base/clock.h"
#include "common/topology/topology.h"
#include "tests/common/text_files.h"
#include "tests/integration/test_aggregator.h"
#include "common/transport/transport_options.h"

namespace dlcp::testing {
namespace {

constexpr absl::Duration kHeartbeatTimeout = absl::Milliseconds(400);

float Value(int rank, int round, uint32_t i) { return static_cast<float>((i * 7 + rank * 13 + round * 5) % 31) - 15; }

std::vector<float> Input(int rank, int round, uint32_t n) {
  std::vector<float> v(n);
  for (uint32_t i = 0; i < n; ++i) v[i] = Value(rank, round, i);
  return v;
}

void ExpectSum(const std::vector<float>& got, int world, int round, const std::string& who) {
  for (uint32_t i = 0; i < got.size(); ++i) {
    float want = 0;
    for (int r = 0; r < world; ++r) want += Value(r, round, i);
    ASSERT_EQ(got[i], want) << who << " round " << round << " element " << i;
  }
}

std::unique_ptr<TestAggregator> StartAggregator(int port = 0) {
  TestAggregatorOptions o;
  o.limits.heartbeat_timeout = kHeartbeatTimeout;
  o.control_port = port;
  return TestAggregator::Start(o);
}

// One exact round of `key` on both clients.
void ExactRound(Client& c0, Client& c1, uint32_t key, int round, uint32_t elems) {
  std::vector<float> d0 = Input(0, round, elems), d1 = Input(1, round, elems);
  auto n0 = c0.AllReduce(key, absl::MakeSpan(d0));
  auto n1 = c1.AllReduce(key, absl::MakeSpan(d1));
  absl::StatusOr<RoundStats> s0 = n0.get(), s1 = n1.get();
  ASSERT_TRUE(s0.ok()) << s0.status();
  ASSERT_TRUE(s1.ok()) << s1.status();
  ExpectSum(d0, 2, round, "rank 0");
  ExpectSum(d1, 2, round, "rank 1");
}

ClientOptions Options(const std::vector<std::string>& aggs, int rank, ClientOptions::AggregatorLoss policy,
                      wire::Encoding encoding = wire::Encoding::kF32) {
  ClientOptions o;
  o.payload_encoding = encoding;  // Value()s and their sums are exact in 16 bits too
  o.aggregators = aggs;
  o.job_name = "failover";
  o.world_size = 2;
  o.rank = rank;
  o.chunk_bytes = 1024;
  o.transport.kind = TransportOptions::Kind::kUdp;
  o.transport.bind_host = "127.0.0.1";
  o.transport.socket_buffer_bytes = 16 << 20;
  o.tls.plaintext = true;
  o.loss_bound = 0;
  o.op_timeout = absl::Seconds(20);
  o.on_aggregator_loss = policy;
  return o;
}

// Float32, and bfloat16, whose pushes go from the packer's packets (which a replay pushes again).
class FailoverTest : public ::testing::TestWithParam<wire::Encoding> {};

TEST_P(FailoverTest, ARoundOnlySomeWorkersFinishedIsFinishedByAllAfterTheRegroup) {
  auto a = StartAggregator();
  auto b = StartAggregator();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const std::vector<std::string> aggs{a->address(), b->address()};
  // The scenario needs rank 1 to push all of round 1 in one turn, before its I/O thread is held:
  // a fixed window, which an adaptive one that a loss cut in round 0 might not allow.
  ClientOptions o0 = Options(aggs, 0, ClientOptions::AggregatorLoss::kRemap, GetParam());
  ClientOptions o1 = Options(aggs, 1, ClientOptions::AggregatorLoss::kRemap, GetParam());
  o0.adaptive_window = o1.adaptive_window = false;
  // Rank 0 pushes round 1 again after the regroup (a replay): its timeline keeps the one span
  // that round had, with no moments of the replay after its end.
  o0.timeline = absl::StrCat("/tmp/dlcp-failover-", getpid(), "-", wire::EncodingName(GetParam()), "-%r.json");
  auto c0 = Client::Connect(o0);
  auto c1 = Client::Connect(o1);
  ASSERT_TRUE(c0.ok()) << c0.status();
  ASSERT_TRUE(c1.ok()) << c1.status();
  constexpr uint32_t kKey = 3, kGate = 9, kElems = 100 * 256;  // 100 chunks: one push turn
  std::vector<float> d0 = Input(0, 0, kElems), d1 = Input(1, 0, kElems);
  // Round 0, everyone.
  auto f0 = (*c0)->AllReduce(kKey, absl::MakeSpan(d0));
  auto f1 = (*c1)->AllReduce(kKey, absl::MakeSpan(d1));
  ASSERT_TRUE(f0.get().ok());
  ASSERT_TRUE(f1.get().ok());
  ExpectSum(d0, 2, 0, "rank 0");

  // Round 1: rank 1 pushes, then its I/O thread is held in a completion, so it does not see the
  // results of round 1 that rank 0 then receives. The aggregator that owns part of it dies.
  d0 = Input(0, 1, kElems);
  d1 = Input(1, 1, kElems);
  std::promise<absl::StatusOr<RoundStats>> r1_done;
  (*c1)->AllReduceAsync(kKey, absl::MakeSpan(d1), {}, [&](absl::StatusOr<RoundStats> s) { r1_done.set_value(s); });
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> held{false};
  float g0 = 1, g1 = 1;
  (*c1)->AllReduceAsync(kGate, absl::MakeSpan(&g1, 1), {}, [&](absl::StatusOr<RoundStats>) {
    held = true;
    released.wait_for(std::chrono::seconds(10));  // bounded, even if the test fails before letting go
  });
  ASSERT_TRUE((*c0)->AllReduce(kGate, absl::MakeSpan(&g0, 1)).get().ok());
  const absl::Time until = MonotonicNow() + absl::Seconds(5);
  while (!held && MonotonicNow() < until) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(held);
  absl::StatusOr<RoundStats> ahead = (*c0)->AllReduce(kKey, absl::MakeSpan(d0)).get();
  ASSERT_TRUE(ahead.ok()) << ahead.status();
  ExpectSum(d0, 2, 1, "rank 0");
  b.reset();
  // Rank 1's own fail-over now waits for its I/O thread, which lets go once the loss is noticed.
  absl::SleepFor(3 * kHeartbeatTimeout + absl::Milliseconds(500));
  release.set_value();

  std::future<absl::StatusOr<RoundStats>> lagging = r1_done.get_future();
  ASSERT_EQ(lagging.wait_for(std::chrono::seconds(15)), std::future_status::ready);
  absl::StatusOr<RoundStats> s = lagging.get();
  ASSERT_TRUE(s.ok()) << s.status();
  ExpectSum(d1, 2, 1, "rank 1");

  // And on, on the survivor alone.
  for (int round = 2; round < 4; ++round) ExactRound(**c0, **c1, kKey, round, kElems);

  // The aggregator comes back at its address: both workers join it again, regroup, and give it
  // its share back.
  const int port = std::stoi(aggs[1].substr(aggs[1].rfind(':') + 1));
  auto back = StartAggregator(port);
  ASSERT_NE(back, nullptr);
  const uint32_t job = (*c0)->job_id();
  const absl::Time deadline = MonotonicNow() + absl::Seconds(10);
  int round = 4;
  // Rounds go on meanwhile; once it serves the job, its share of every round is done there. A
  // tensor of 16 blocks, so that it has a share (each block picks one of the two).
  constexpr uint32_t kBig = 4, kBigElems = 16 * kBlockChunks * 256;
  while (MonotonicNow() < deadline) {
    ExactRound(**c0, **c1, kBig, round++, kBigElems);
    if (HasFatalFailure()) return;
    std::shared_ptr<server::Job> j = back->jobs().Find(job);
    if (j && j->rounds_completed.load() > 0) break;
  }
  std::shared_ptr<server::Job> j = back->jobs().Find(job);
  ASSERT_NE(j, nullptr) << "the workers never joined the restarted aggregator";
  EXPECT_EQ(j->member_count.load(), 2u);
  EXPECT_GT(j->rounds_completed.load(), 0u) << "the restarted aggregator got no share of the rounds";
  for (int k = 0; k < 3; ++k) ExactRound(**c0, **c1, kBig, round++, kBigElems);
  ExactRound(**c0, **c1, kKey, round++, kElems);

  ASSERT_TRUE((*c0)->Close().ok());
  const std::string path = absl::StrReplaceAll(o0.timeline, {{"%r", "0"}});
  const std::string trace = ReadFile(path);
  const std::string round1 = "\"id\":\"0x300000001\"";  // key 3, round 1
  EXPECT_EQ(CountOccurrences(trace, "\"ph\":\"b\"," + round1), 1u) << trace.substr(0, 2000);
  EXPECT_EQ(CountOccurrences(trace, "\"ph\":\"e\"," + round1), 1u);
  EXPECT_EQ(CountOccurrences(trace, "\"name\":\"first push\",\"cat\":\"op\",\"ph\":\"n\"," + round1), 1u)
      << "the replay's pushes are on the timeline of a span that had ended";
  std::remove(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(Encodings, FailoverTest, ::testing::Values(wire::Encoding::kF32, wire::Encoding::kBF16),
                         [](const auto& info) { return std::string(wire::EncodingName(info.param)); });

// A draining aggregator (dlcpd got SIGTERM) tells the workers in their next heartbeat answer:
// they take it as lost while it still serves, keep it lost while it refuses their joins (which
// tell it they have let go), and rounds in flight meanwhile finish exactly on the other one.
TEST(Failover, ADrainingAggregatorIsLeftWhileItStillServes) {
  auto a = StartAggregator();
  auto b = StartAggregator();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const std::vector<std::string> aggs{a->address(), b->address()};
  auto c0 = Client::Connect(Options(aggs, 0, ClientOptions::AggregatorLoss::kRemap));
  auto c1 = Client::Connect(Options(aggs, 1, ClientOptions::AggregatorLoss::kRemap));
  ASSERT_TRUE(c0.ok()) << c0.status();
  ASSERT_TRUE(c1.ok()) << c1.status();
  constexpr uint32_t kKey = 4, kElems = 16 * kBlockChunks * 256;  // 16 blocks: both get a share
  int round = 0;
  for (; round < 2; ++round) ExactRound(**c0, **c1, kKey, round, kElems);
  std::shared_ptr<server::Job> at_b = b->jobs().Find((*c0)->job_id());
  ASSERT_NE(at_b, nullptr);
  ASSERT_GT(at_b->rounds_completed.load(), 0u);
  std::shared_ptr<server::Job> at_a = a->jobs().Find((*c0)->job_id());
  ASSERT_NE(at_a, nullptr);
  const uint32_t epoch_at_a = at_a->epoch.load();

  b->service().drain().Begin();
  const absl::Time deadline = MonotonicNow() + absl::Seconds(10);
  while (!b->service().drain().Untold(b->jobs()).empty() && MonotonicNow() < deadline) {
    ExactRound(**c0, **c1, kKey, round++, kElems);  // through the regroup
    if (HasFatalFailure()) return;
  }
  ASSERT_TRUE(b->service().drain().Untold(b->jobs()).empty()) << "a worker never heard of the drain";
  // Once both have regrouped (milliseconds after hearing), b gets no share, though it still
  // answers: only the drain could have moved them off it. a, the one left, takes a new epoch
  // once both workers have paused for the regroup; ops from then on wait for the new layout.
  while (at_a->epoch.load() == epoch_at_a && MonotonicNow() < deadline) absl::SleepFor(absl::Milliseconds(5));
  ASSERT_NE(at_a->epoch.load(), epoch_at_a) << "the workers never regrouped on a";
  absl::SleepFor(absl::Milliseconds(200));  // for pushes to b sent before the pause
  const uint32_t b_rounds = at_b->rounds_completed.load();
  for (int k = 0; k < 3; ++k) ExactRound(**c0, **c1, kKey, round++, kElems);
  EXPECT_EQ(at_b->rounds_completed.load(), b_rounds) << "rounds still went to the draining aggregator";
  // Each has probed b with a join since it moved, which is how b learns it may stop (no
  // heartbeat interval of silence).
  while (!b->service().drain().Holding(b->jobs()).empty() && MonotonicNow() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(b->service().drain().Holding(b->jobs()).empty()) << "a worker moved off b without probing it";
  EXPECT_FALSE(at_a->failed.load());
}

TEST(Failover, WithTheFailPolicyOpsFailNamingTheAggregator) {
  auto a = StartAggregator();
  auto b = StartAggregator();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const std::vector<std::string> aggs{a->address(), b->address()};
  auto c0 = Client::Connect(Options(aggs, 0, ClientOptions::AggregatorLoss::kFail));
  ASSERT_TRUE(c0.ok()) << c0.status();
  const std::string lost = b->address();
  b.reset();
  absl::SleepFor(3 * kHeartbeatTimeout);
  std::vector<float> d(1000, 1.0f);
  absl::StatusOr<RoundStats> s = (*c0)->AllReduce(1, absl::MakeSpan(d)).get();
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable) << s.status();
  EXPECT_NE(s.status().message().find(lost), std::string::npos) << s.status();
}

// A worker restarts: the others' ops fail naming it, and once it has joined again the job goes
// on, every key's rounds counting from 0 in a new epoch, exactly.
TEST(Rejoin, ARestartedWorkerJoinsAgainAndTheJobGoesOn) {
  auto a = StartAggregator();
  auto b = StartAggregator();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const std::vector<std::string> aggs{a->address(), b->address()};
  constexpr int kWorld = 3;
  constexpr uint32_t kKey = 5, kElems = 8 * kBlockChunks * 256;
  auto options = [&](int rank) {
    ClientOptions o = Options(aggs, rank, ClientOptions::AggregatorLoss::kFail);
    o.job_name = "rejoin";
    o.world_size = kWorld;
    return o;
  };
  std::vector<std::unique_ptr<Client>> c(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    auto client = Client::Connect(options(r));
    ASSERT_TRUE(client.ok()) << client.status();
    c[r] = std::move(*client);
  }
  // Every worker's input for a round; each retries until the job takes it, as a trainer would.
  auto round_on_all = [&](int round) {
    std::vector<std::vector<float>> d(kWorld);
    std::vector<std::future<absl::StatusOr<RoundStats>>> f(kWorld);
    std::vector<bool> done(kWorld, false);
    const absl::Time deadline = MonotonicNow() + absl::Seconds(15);
    while (MonotonicNow() < deadline) {
      for (int r = 0; r < kWorld; ++r) {
        if (done[r] || f[r].valid()) continue;
        d[r] = Input(r, round, kElems);
        f[r] = c[r]->AllReduce(kKey, absl::MakeSpan(d[r]));
      }
      bool all = true;
      for (int r = 0; r < kWorld; ++r) {
        if (done[r]) continue;
        all = false;
        if (f[r].wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) continue;
        absl::StatusOr<RoundStats> s = f[r].get();
        if (s.ok()) {
          done[r] = true;
          ExpectSum(d[r], kWorld, round, absl::StrCat("rank ", r));
        } else {
          absl::SleepFor(absl::Milliseconds(50));  // the job is not back yet
        }
      }
      if (all) return;
    }
    ADD_FAILURE() << "round " << round << " never completed on every worker";
  };
  round_on_all(0);
  round_on_all(1);

  // Rank 2's trainer dies (it closes its client on the way out); the others' next ops need it.
  ASSERT_TRUE(c[2]->Close().ok());
  c[2].reset();
  std::vector<float> d0 = Input(0, 2, kElems), d1 = Input(1, 2, kElems);
  auto f0 = c[0]->AllReduce(kKey, absl::MakeSpan(d0));
  auto f1 = c[1]->AllReduce(kKey, absl::MakeSpan(d1));
  for (auto* f : {&f0, &f1}) {
    ASSERT_EQ(f->wait_for(std::chrono::seconds(10)), std::future_status::ready);
    absl::StatusOr<RoundStats> s = f->get();
    EXPECT_EQ(s.status().code(), absl::StatusCode::kAborted) << s.status();
    EXPECT_NE(s.status().message().find("worker rank 2 left"), std::string::npos) << s.status();
    EXPECT_NE(s.status().message().find("joined again"), std::string::npos) << s.status();
  }

  // Restarted, it joins again: rounds start from 0 for everyone, in a new epoch.
  const uint32_t epoch_before = a->jobs().Find(c[0]->job_id())->epoch.load();
  auto restarted = Client::Connect(options(2));
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  c[2] = std::move(*restarted);
  std::shared_ptr<server::Job> job = a->jobs().Find(c[0]->job_id());
  ASSERT_NE(job, nullptr);
  EXPECT_FALSE(job->failed.load());
  EXPECT_EQ(job->rejoins.load(), 1u);
  EXPECT_NE(job->epoch.load(), epoch_before);
  for (int round = 10; round < 13; ++round) round_on_all(round);
}

TEST(Failover, ClientsRefuseAnUnknownPolicyName) {
  EXPECT_EQ(ParseAggregatorLoss("remap").value(), ClientOptions::AggregatorLoss::kRemap);
  EXPECT_EQ(ParseAggregatorLoss("fail").value(), ClientOptions::AggregatorLoss::kFail);
  EXPECT_EQ(ParseAggregatorLoss("retry").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dlcp::testing
