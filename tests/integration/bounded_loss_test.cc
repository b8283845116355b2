// Bounded loss end to end, in one process: real clients, gRPC control and data threads, with
// per-class and bursty packet loss injected at the workers and at the aggregators.
//
// Worker r contributes 16^r * m with m in 1..15, so every element of a result spells out, digit
// by digit, exactly which workers' contributions are in it. The tests decode that and check the
// guarantee: no class-0 contribution is ever missing, at most ε of the droppable ones are, the
// result is exactly the sum of what is in it, every worker got the same result, and the counts
// the aggregators report in STOP match.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/classes/class_policy.h"
#include "tests/integration/test_aggregator.h"
#include "common/transport/transport_options.h"

namespace dlcp::testing {
namespace {

struct Case {
  std::string name;
  TransportOptions::Kind kind;
  int aggregators;
  int workers;
  uint32_t elems;
  double loss_bound;
  std::string worker_drops;  // injected at each worker, by class
  std::string agg_drops;     // injected at each aggregator, by class
  uint32_t burst = 1;
  bool rescale = false;
  bool expect_loss = false;  // the drops are heavy enough that the bound must have been used
  int rounds = 6;
  uint64_t window_bytes = 4 << 20;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

constexpr uint32_t kChunkBytes = 256;  // 64 floats: many chunks from small tensors

float Digit(int r, int k, uint32_t i) { return static_cast<float>(1 + (i * 7 + r * 13 + k * 5 + i / 64 * 3) % 15); }
float Value(int r, int k, uint32_t i) { return std::ldexp(Digit(r, k, i), 4 * r); }

class BoundedLossTest : public ::testing::TestWithParam<Case> {};

TEST_P(BoundedLossTest, GuaranteeHolds) {
  const Case c = GetParam();
  std::vector<std::unique_ptr<TestAggregator>> aggs;
  std::vector<std::string> addrs;
  for (int a = 0; a < c.aggregators; ++a) {
    TestAggregatorOptions ao{c.kind, 1, 0, 200u + a};
    ASSERT_TRUE(ParseClassDrops(c.agg_drops, &ao.inject_class.rate).ok());
    ao.inject_class.burst = c.burst;
    ao.inject_class.seed = 300 + a;
    aggs.push_back(TestAggregator::Start(ao));
    ASSERT_NE(aggs.back(), nullptr);
    addrs.push_back(aggs.back()->address());
  }
  const wire::ChunkGeometry g{c.elems, kChunkBytes / 4};
  const uint32_t chunks = g.chunk_count();
  // results[k][r]: what worker r got in round k; stats likewise.
  std::vector<std::vector<std::vector<float>>> results(c.rounds, std::vector<std::vector<float>>(c.workers));
  std::vector<std::vector<RoundStats>> stats(c.rounds, std::vector<RoundStats>(c.workers));
  std::vector<std::string> errors(c.workers);
  std::vector<std::thread> threads;
  for (int r = 0; r < c.workers; ++r) {
    threads.emplace_back([&, r] {
      ClientOptions o;
      o.aggregators = addrs;
      o.job_name = c.name;
      o.world_size = c.workers;
      o.rank = r;
      o.chunk_bytes = kChunkBytes;
      o.transport.kind = c.kind;
      o.transport.bind_host = "127.0.0.1";
      o.tls.plaintext = true;
      o.repair_timeout = absl::Milliseconds(5);
      o.op_timeout = absl::Seconds(60);
      o.loss_bound = c.loss_bound;
      o.window_bytes = c.window_bytes;
      o.error_feedback = false;  // the test checks each round's own contributions
      o.compensation = c.rescale ? ClientOptions::Compensation::kRescale : ClientOptions::Compensation::kZeroFill;
      if (!ParseClassDrops(c.worker_drops, &o.inject.rate).ok()) return;
      o.inject.burst = c.burst;
      o.inject.seed = 1000 + r;
      auto client = Client::Connect(o);
      if (!client.ok()) {
        errors[r] = client.status().ToString();
        return;
      }
      for (int k = 0; k < c.rounds; ++k) {
        std::vector<float>& d = results[k][r];
        d.resize(c.elems);
        for (uint32_t i = 0; i < c.elems; ++i) d[i] = Value(r, k, i);
        absl::StatusOr<RoundStats> s = (*client)->AllReduce(7, absl::MakeSpan(d)).get();
        if (!s.ok()) {
          errors[r] = absl::StrCat("round ", k, ": ", s.status().ToString());
          return;
        }
        stats[k][r] = *s;
      }
      if (absl::Status s = (*client)->Close(); !s.ok()) errors[r] = s.ToString();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < c.workers; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;

  // The classes each worker gave its chunks, recomputed with the same default policy.
  auto policy = CreateClassPolicy(ClassPolicyOptions{});
  ASSERT_TRUE(policy.ok());
  uint64_t all_droppable = 0, all_missing = 0;
  for (int k = 0; k < c.rounds; ++k) {
    std::vector<std::vector<uint8_t>> cls(c.workers, std::vector<uint8_t>(chunks));
    for (int r = 0; r < c.workers; ++r) {
      std::vector<float> mine(c.elems);
      for (uint32_t i = 0; i < c.elems; ++i) mine[i] = Value(r, k, i);
      (*policy)->Classify(mine, g, TensorInfo{}, absl::MakeSpan(cls[r]));
    }
    uint64_t droppable = 0, missing = 0;
    std::vector<uint64_t> left_out_by_worker(c.workers);
    for (uint32_t ch = 0; ch < chunks; ++ch) {
      // Which subset of workers explains the first element; then every element must agree.
      const float got = results[k][0][g.offset(ch)];
      int subset = -1;
      for (int s = 0; s < (1 << c.workers) && subset < 0; ++s) {
        double sum = 0;
        for (int w = 0; w < c.workers; ++w) sum += (s >> w & 1) ? Value(w, k, g.offset(ch)) : 0;
        const int n = __builtin_popcount(s);
        const double scale = c.rescale && n > 0 ? static_cast<double>(c.workers) / n : 1.0;
        if (std::fabs(sum * scale - got) <= 1e-6 * std::fabs(got)) subset = s;
      }
      ASSERT_GE(subset, 0) << "round " << k << " chunk " << ch << ": " << got << " is no subset's sum";
      const int n = __builtin_popcount(subset);
      const double scale = c.rescale && n > 0 ? static_cast<double>(c.workers) / n : 1.0;
      for (uint32_t i = g.offset(ch); i < g.offset(ch) + g.elems(ch); ++i) {
        double want = 0;
        for (int w = 0; w < c.workers; ++w) want += (subset >> w & 1) ? Value(w, k, i) : 0;
        want *= scale;
        for (int r = 0; r < c.workers; ++r) {
          ASSERT_NEAR(results[k][r][i], want, c.rescale ? 1e-6 * std::fabs(want) : 0)
              << "round " << k << " worker " << r << " element " << i << " (chunk " << ch << ", subset " << subset << ")";
        }
      }
      for (int w = 0; w < c.workers; ++w) {
        const bool in = subset >> w & 1;
        if (cls[w][ch] == 0) {
          ASSERT_TRUE(in) << "round " << k << ": class-0 chunk " << ch << " of worker " << w << " was lost";
        } else {
          ++droppable;
          missing += !in;
        }
        left_out_by_worker[w] += !in;
      }
    }
    // The bound holds for the whole tensor in every round.
    EXPECT_LE(static_cast<double>(missing), std::floor(c.loss_bound * droppable + 1e-9) + 0.0)
        << "round " << k << ": " << missing << " of " << droppable << " droppable contributions missing";
    for (int r = 0; r < c.workers; ++r) {
      const RoundStats& s = stats[k][r];
      EXPECT_EQ(s.bound_violations, 0u);
      // ε = 0 runs the reliable protocol: no manifest, no STOP, nothing droppable.
      EXPECT_EQ(s.droppable_total, c.loss_bound > 0 ? droppable : 0) << "round " << k << " worker " << r;
      EXPECT_EQ(s.droppable_missing, missing) << "round " << k << " worker " << r;
      uint64_t left = 0;
      for (uint64_t v : s.left_out_by_class) left += v;
      EXPECT_EQ(left, left_out_by_worker[r]) << "round " << k << " worker " << r;
      EXPECT_EQ(s.left_out_by_class[0], 0u);
      if (c.loss_bound > 0) {
        EXPECT_GT(s.time_to_stop, absl::ZeroDuration());
        // A round that left something out sealed when its tail ran out, after the bound was met.
        EXPECT_LE(s.tail_wait, s.time_to_stop) << "round " << k << " worker " << r;
        if (missing > 0) {
          EXPECT_GT(s.tail_wait, absl::ZeroDuration()) << "round " << k << " worker " << r;
        }
      }
    }
    all_droppable += droppable;
    all_missing += missing;
  }
  double injected = 0;
  for (auto& a : aggs) injected += a->Counter("dlcp_inject_dropped_total");
  for (int k = 0; k < c.rounds; ++k) {
    for (int r = 0; r < c.workers; ++r) injected += stats[k][r].injected_drops;
  }
  if (!c.worker_drops.empty() || !c.agg_drops.empty()) {
    EXPECT_GT(injected, 0) << "no loss was injected";
  }
  if (c.expect_loss) {
    EXPECT_GT(all_missing, 0u) << "the bound was never used";
  }
  std::cout << c.name << ": " << all_missing << " of " << all_droppable << " droppable contributions left out, "
            << injected << " packets dropped\n";
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, BoundedLossTest,
    ::testing::Values(
        Case{"loopback_w2_clean", TransportOptions::Kind::kLoopback, 1, 2, 5000, 0.01, "", ""},
        Case{"loopback_w4_eps5pct", TransportOptions::Kind::kLoopback, 1, 4, 20000, 0.05, "1:0.05,2:0.1,3:0.2", "", 1,
             false, true},
        Case{"loopback_a2_w3_bursts", TransportOptions::Kind::kLoopback, 2, 3, 30011, 0.02, "1:0.1,2:0.1,3:0.1",
             "3:0.1", 8},
        Case{"loopback_w4_class0_lossy", TransportOptions::Kind::kLoopback, 1, 4, 10000, 0.01, "0:0.2,1:0.2,3:0.5",
             "0:0.1,1:0.1"},
        Case{"loopback_w3_eps0_lossy", TransportOptions::Kind::kLoopback, 1, 3, 9000, 0.0, "1:0.2", "2:0.2"},
        Case{"loopback_w2_rescale", TransportOptions::Kind::kLoopback, 1, 2, 20000, 0.2, "1:0.3,2:0.3,3:0.3", "", 1,
             true},
        Case{"udp_a2_w4_eps1pct", TransportOptions::Kind::kUdp, 2, 4, 100003, 0.01, "1:0.02,2:0.05,3:0.1", "1:0.01"},
        Case{"udp_w4_half_lost", TransportOptions::Kind::kUdp, 1, 4, 40000, 0.5, "1:0.5,2:0.5,3:0.5", "0:0.05", 4,
             false, true},
        // Bursts wipe out whole windows the bound lets the aggregator skip: the window must not
        // wait for their results, or the round never reaches its seal.
        Case{"loopback_w3_small_window_bursts", TransportOptions::Kind::kLoopback, 1, 3, 20000, 0.3,
             "1:0.2,2:0.2,3:0.3", "", 16, false, true, 4, 8 * kChunkBytes},
        // Every class-3 push is lost and windows are one chunk: each round stalls on every lost
        // push, and must still seal within ε = 0.5 and finish.
        Case{"loopback_w2_sealed_before_pushed", TransportOptions::Kind::kLoopback, 1, 2, 6000, 0.5, "3:1", "", 1,
             false, true, 4, kChunkBytes}),
    [](const auto& info) { return info.param.name; });

// Rank `rank` of a 2-worker `job` on one loopback aggregator, ε = 0.01, small chunks.
ClientOptions PairOptions(const TestAggregator& agg, const std::string& job, int rank) {
  ClientOptions o;
  o.aggregators = {agg.address()};
  o.job_name = job;
  o.world_size = 2;
  o.rank = rank;
  o.chunk_bytes = kChunkBytes;
  o.transport.kind = TransportOptions::Kind::kLoopback;
  o.tls.plaintext = true;
  o.loss_bound = 0.01;
  return o;
}

// Telemetry: asked for, a round reports the class this worker gave each chunk, which is what the
// class policy gives its data: here the 7 largest of 64 chunks (10%) in class 0. A reliable
// round's tensor rides one class, class 1 when its depth is unknown. Not asked for, nothing.
TEST(ClassTelemetry, EachChunksClassIsReportedWhenAskedFor) {
  auto agg = TestAggregator::Start({TransportOptions::Kind::kLoopback});
  ASSERT_NE(agg, nullptr);
  constexpr uint32_t kChunks = 64, kElems = kChunks * kChunkBytes / 4;
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      const ClientOptions o = PairOptions(*agg, "classes", r);
      auto client = Client::Connect(o);
      if (!client.ok()) return void(errors[r] = client.status().ToString());
      // Chunk c holds c + 1 (times the rank's own factor): chunk 63 is the largest.
      auto fill = [&](std::vector<float>& d) {
        for (uint32_t i = 0; i < kElems; ++i) d[i] = static_cast<float>((i / (kChunkBytes / 4) + 1) * (r + 1));
      };
      std::vector<float> d(kElems);
      fill(d);
      auto policy = CreateClassPolicy(o.class_policy);
      if (!policy.ok()) return void(errors[r] = policy.status().ToString());
      std::vector<uint8_t> want(kChunks);
      (*policy)->Classify(d, wire::ChunkGeometry{kElems, kChunkBytes / 4}, TensorInfo{0, 0, 0.01}, absl::MakeSpan(want));
      AllReduceOptions asked;
      asked.report_classes = true;
      auto st = (*client)->AllReduce(5, absl::MakeSpan(d), asked).get();
      if (!st.ok()) return void(errors[r] = st.status().ToString());
      if (st->classes != want) return void(errors[r] = "reported classes differ from the policy's");
      std::array<uint64_t, 4> counts{};
      for (uint8_t c : st->classes) ++counts[c];
      if (counts != st->chunks_by_class) return void(errors[r] = "reported classes differ from chunks_by_class");
      for (uint32_t c = 0; c < kChunks; ++c) {
        if ((st->classes[c] == 0) != (c >= kChunks - 7)) return void(errors[r] = absl::StrCat("chunk ", c, " in class ", st->classes[c]));
      }
      fill(d);
      st = (*client)->AllReduce(5, absl::MakeSpan(d)).get();
      if (!st.ok() || !st->classes.empty()) return void(errors[r] = "classes reported unasked");
      fill(d);
      asked.loss_bound = 0;
      st = (*client)->AllReduce(5, absl::MakeSpan(d), asked).get();
      if (!st.ok() || st->classes != std::vector<uint8_t>(kChunks, 1)) return void(errors[r] = "reliable round not in class 1");
      if (absl::Status s = (*client)->Close(); !s.ok()) errors[r] = s.ToString();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

}  // namespace
}  // namespace dlcp::testing

namespace dlcp::testing {
namespace {

// The bounded pull mode: with results dropped on the way back, each worker may finish without up
// to ε_pull of the result chunks it classed droppable; those are zeroed and counted, never the
// ones it classed 0. Broadcast then makes every replica identical again, exactly.
TEST(BoundedPull, MissingResultsStayWithinTheBoundAndBroadcastResynchronises) {
  TestAggregatorOptions ao{TransportOptions::Kind::kLoopback, 1, 0, 77};
  ASSERT_TRUE(ParseClassDrops("2:0.3,3:0.3", &ao.inject_class.rate).ok());  // pushes and results
  auto agg = TestAggregator::Start(ao);
  ASSERT_NE(agg, nullptr);
  constexpr int kWorkers = 3, kRounds = 5;
  constexpr uint32_t kElems = 20000;
  constexpr double kPull = 0.1;
  const wire::ChunkGeometry g{kElems, kChunkBytes / 4};
  std::vector<std::string> errors(kWorkers);
  std::vector<uint64_t> missing(kWorkers);
  std::vector<std::vector<float>> replicas(kWorkers, std::vector<float>(kElems));
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorkers; ++r) {
    threads.emplace_back([&, r] {
      ClientOptions o;
      o.aggregators = {agg->address()};
      o.job_name = "bounded-pull";
      o.world_size = kWorkers;
      o.rank = r;
      o.chunk_bytes = kChunkBytes;
      o.transport.kind = TransportOptions::Kind::kLoopback;
      o.tls.plaintext = true;
      o.repair_timeout = absl::Milliseconds(5);
      o.loss_bound = 0.3;
      o.pull_mode = ClientOptions::PullMode::kBounded;
      o.pull_loss_bound = kPull;
      o.error_feedback = false;
      o.compensation = ClientOptions::Compensation::kZeroFill;
      auto client = Client::Connect(o);
      if (!client.ok()) return void(errors[r] = client.status().ToString());
      auto policy = CreateClassPolicy(ClassPolicyOptions{});
      for (int k = 0; k < kRounds; ++k) {
        std::vector<float> d(kElems);
        for (uint32_t i = 0; i < kElems; ++i) d[i] = Value(r, k, i);
        std::vector<uint8_t> cls(g.chunk_count());
        (*policy)->Classify(d, g, TensorInfo{}, absl::MakeSpan(cls));
        auto s = (*client)->AllReduce(1, absl::MakeSpan(d)).get();
        if (!s.ok()) return void(errors[r] = s.status().ToString());
        uint64_t zeroed = 0, droppable = 0;
        for (uint32_t c = 0; c < g.chunk_count(); ++c) {
          droppable += cls[c] != 0;
          const bool zero = std::all_of(d.begin() + g.offset(c), d.begin() + g.offset(c) + g.elems(c),
                                        [](float v) { return v == 0; });
          if (zero && cls[c] == 0) return void(errors[r] = absl::StrCat("class-0 result ", c, " missing"));
          zeroed += zero;
        }
        // A chunk can also be zero because every contribution to it was lost on the way in.
        if (zeroed < s->pull_missing) {
          return void(errors[r] = absl::StrCat("round ", k, ": ", zeroed, " zero chunks, ", s->pull_missing, " reported"));
        }
        if (s->pull_missing > static_cast<uint64_t>(kPull * droppable)) {
          return void(errors[r] = absl::StrCat("round ", k, ": ", s->pull_missing, " of ", droppable, " missing"));
        }
        missing[r] += s->pull_missing;
        replicas[r] = d;
      }
      // Resynchronise from rank 1's replica: every replica then holds exactly its bytes.
      std::vector<float> expect = replicas[r];
      auto b = (*client)->Broadcast(2, absl::MakeSpan(replicas[r]), 1).get();
      if (!b.ok()) return void(errors[r] = b.status().ToString());
      if (absl::Status s = (*client)->Close(); !s.ok()) errors[r] = s.ToString();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorkers; ++r) ASSERT_EQ(errors[r], "") << "rank " << r;
  for (int r = 0; r < kWorkers; ++r) EXPECT_EQ(replicas[r], replicas[1]) << "rank " << r << " after Broadcast";
  uint64_t total = 0;
  for (auto m : missing) total += m;
  EXPECT_GT(total, 0u) << "no result was ever given up on: the test did not exercise the bounded pull";
}

TEST(BoundedPull, BroadcastRejectsARootOutsideTheJob) {
  auto agg = TestAggregator::Start({TransportOptions::Kind::kLoopback});
  ASSERT_NE(agg, nullptr);
  ClientOptions o;
  o.aggregators = {agg->address()};
  o.job_name = "broadcast-root";
  o.transport.kind = TransportOptions::Kind::kLoopback;
  o.tls.plaintext = true;
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<float> d(10, 1.0f);
  EXPECT_EQ((*client)->Broadcast(0, absl::MakeSpan(d), 1).get().status().code(), absl::StatusCode::kInvalidArgument);
  auto ok = (*client)->Broadcast(0, absl::MakeSpan(d), 0).get();
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(d, std::vector<float>(10, 1.0f));
}

}  // namespace
}  // namespace dlcp::testing

namespace dlcp::testing {
namespace {

// Phase-aware tolerance end to end: ε relaxes while a tensor's norm is steady and snaps back when
// it jumps; the aggregators enforce whatever each round ran under.
TEST(PhaseAware, TheBoundFollowsTheGradientNorm) {
  auto agg = TestAggregator::Start({TransportOptions::Kind::kLoopback});
  ASSERT_NE(agg, nullptr);
  std::vector<std::vector<double>> bounds(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      ClientOptions o = PairOptions(*agg, "phase-aware", r);
      o.phase_aware = {true, 4.0, 0.5, 2};
      auto client = Client::Connect(o);
      if (!client.ok()) return void(errors[r] = client.status().ToString());
      const float scale[] = {1, 1, 1, 1, 3, 3, 3, 3};  // the norm triples at round 4
      for (float s : scale) {
        std::vector<float> d(4096, s);
        auto st = (*client)->AllReduce(3, absl::MakeSpan(d)).get();
        if (!st.ok()) return void(errors[r] = st.status().ToString());
        bounds[r].push_back(st->loss_bound);
        if (st->bound_violations != 0) errors[r] = "bound violated";
      }
      if (absl::Status s = (*client)->Close(); !s.ok()) errors[r] = s.ToString();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(errors[r], "");
    EXPECT_EQ(bounds[r], (std::vector<double>{0.01, 0.01, 0.04, 0.04, 0.01, 0.01, 0.04, 0.04})) << "rank " << r;
  }
}

}  // namespace
}  // namespace dlcp::testing
