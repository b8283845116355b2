// Data-key rotation (docs/security.md): a job's rounds run on, exact and with nothing refused,
// while each aggregator moves its key on twice; afterwards the first key no longer authenticates.
// Real clients, real gRPC heartbeats, real UDP data threads.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/transfer_engine.h"
#include "common/base/clock.h"
#include "common/wire/header.h"
#include "common/wire/mac.h"
#include "server/jobs/job_registry.h"
#include "tests/integration/client_test_util.h"
#include "tests/integration/test_aggregator.h"
#include "common/transport/factory.h"

namespace dlcp::testing {
namespace {

constexpr int kWorkers = 3;
constexpr uint32_t kElems = 3000;  // 12 chunks of 1 KiB: 6 on each aggregator

ClientOptions RotatingOpts(std::vector<std::string> aggs, uint32_t rank) {
  ClientOptions o = Opts(aggs[0], "rotating", kWorkers, rank);
  o.aggregators = std::move(aggs);
  o.op_timeout = absl::Seconds(10);
  o.heartbeat_interval = absl::Milliseconds(50);
  return o;
}

// Waits until the job's key at `agg` has settled at `generation` (every member moved to it and
// the grace period passed), moving the rotation on as dlcpd's main loop would.
bool SettlesAt(TestAggregator& agg, uint32_t generation, absl::Duration deadline) {
  const absl::Time end = MonotonicNow() + deadline;
  while (MonotonicNow() < end) {
    for (const std::string& line : agg.jobs().TendKeys(MonotonicNow())) (void)line;
    std::shared_ptr<server::Job> job = agg.jobs().Find(server::JobIdForName("rotating"));
    if (job && job->keys()->generation == generation && !job->keys()->previous) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

TEST(KeyRotation, RoundsRunOnThroughTwoRotationsAndTheFirstKeyStopsWorking) {
  TestAggregatorOptions ao;
  ao.limits.data_key_grace = absl::Milliseconds(200);
  std::vector<std::unique_ptr<TestAggregator>> aggs;
  for (int i = 0; i < 2; ++i) {
    aggs.push_back(TestAggregator::Start(ao));
    ASSERT_NE(aggs.back(), nullptr);
  }
  const std::vector<std::string> addresses{aggs[0]->address(), aggs[1]->address()};
  std::vector<std::unique_ptr<Client>> clients(kWorkers);
  {
    std::vector<std::thread> joins;
    for (int r = 0; r < kWorkers; ++r) {
      joins.emplace_back([&, r] {
        if (auto c = Client::Connect(RotatingOpts(addresses, r)); c.ok()) clients[r] = std::move(*c);
      });
    }
    for (auto& j : joins) j.join();
  }
  for (auto& c : clients) ASSERT_NE(c, nullptr);
  const uint32_t job_id = server::JobIdForName("rotating");
  std::vector<wire::MacKey> first_keys;
  for (auto& a : aggs) {
    std::shared_ptr<server::Job> job = a->jobs().Find(job_id);
    ASSERT_NE(job, nullptr);
    ASSERT_EQ(job->keys()->generation, 1u);
    first_keys.push_back(*job->worker_key(0));  // what rank 0 signed with
  }

  // Every worker runs rounds until told the last one (the rounds are in lock step, so each can
  // reach it), checking every element of every sum.
  std::atomic<int> last_round{1 << 30};
  std::vector<std::atomic<int>> done(kWorkers);
  std::vector<std::string> errors(kWorkers);
  std::vector<std::thread> workers;
  for (int r = 0; r < kWorkers; ++r) {
    workers.emplace_back([&, r] {
      std::vector<float> data(kElems);
      for (int round = 0; round < last_round.load(); ++round) {
        for (uint32_t i = 0; i < kElems; ++i) data[i] = static_cast<float>((r + 1) * (round + 1) + i % 7);
        absl::StatusOr<RoundStats> s = clients[r]->AllReduce(1, absl::MakeSpan(data)).get();
        if (!s.ok()) {
          errors[r] = absl::StrCat("round ", round, ": ", s.status().ToString());
          return;
        }
        for (uint32_t i = 0; i < kElems; ++i) {
          const float want = static_cast<float>(6 * (round + 1) + kWorkers * (i % 7));  // ranks 1+2+3
          if (data[i] != want) {
            errors[r] = absl::StrCat("round ", round, " element ", i, ": ", data[i], ", want ", want);
            return;
          }
        }
        done[r].store(round + 1);
      }
    });
  }
  auto rounds_done = [&] {
    int least = 1 << 30;
    for (auto& d : done) least = std::min(least, d.load());
    return least;
  };
  auto progress_after = [&](int rounds, absl::Duration deadline) {
    const absl::Time end = MonotonicNow() + deadline;
    while (rounds_done() < rounds && MonotonicNow() < end) absl::SleepFor(absl::Milliseconds(5));
    return rounds_done() >= rounds;
  };
  EXPECT_TRUE(progress_after(5, absl::Seconds(10)));
  for (uint32_t generation : {2u, 3u}) {
    // EXPECT, not ASSERT: the workers' threads must be joined below whatever happens.
    for (auto& a : aggs) EXPECT_TRUE(a->jobs().RotateKey(job_id, MonotonicNow()).value_or(false));
    for (auto& a : aggs) EXPECT_TRUE(SettlesAt(*a, generation, absl::Seconds(10))) << "generation " << generation;
    // Rounds go on under the settled key: results signed with it check out at the workers.
    EXPECT_TRUE(progress_after(rounds_done() + 5, absl::Seconds(10)));
  }
  last_round.store(rounds_done() + 3);
  for (auto& w : workers) w.join();
  for (int r = 0; r < kWorkers; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  for (auto& a : aggs) {
    // Not one packet was refused while keys changed: every push was signed with a key the
    // aggregator still accepted.
    EXPECT_EQ(a->Counter("dlcp_rejects_total{reason=\"bad_mac\"}"), 0);
  }

  // A push signed with the first key is now refused as forged; the same push under the current
  // key is not (it is merely stale: its round is long done).
  TransportOptions t;
  t.bind_host = "127.0.0.1";
  auto tx = CreateTransport(t);
  ASSERT_TRUE(tx.ok());
  std::shared_ptr<server::Job> job = aggs[0]->jobs().Find(job_id);
  ASSERT_NE(job, nullptr);
  auto send_push = [&](const wire::MacKey& key) {
    wire::Header h;
    h.type = wire::MsgType::kPush;
    h.priority = 1;
    h.job = job_id;
    h.key = 1;
    h.round = 0;
    h.chunk = 0;
    h.chunk_count = 3;  // 3000 floats in 1024-byte chunks
    h.tensor_elems = kElems;
    h.rank = 0;
    h.epoch = job->epoch;
    h.payload_len = 1024;
    h.flags = wire::kFlagMac;
    std::vector<float> payload(256, 1.0f);
    uint8_t header[wire::kHeaderSize], tag[wire::kMacSize];
    wire::EncodeHeader(h, header);
    wire::ComputeMac(key, header, reinterpret_cast<uint8_t*>(payload.data()), h.payload_len, tag);
    OutMessage m{aggs[0]->data().endpoints()[0], 1, header, wire::kHeaderSize,
                 reinterpret_cast<uint8_t*>(payload.data()), h.payload_len, tag, wire::kMacSize};
    ASSERT_TRUE((*tx)->Send({&m, 1}, MonotonicNow() + absl::Seconds(1)).ok());
  };
  // One socket, one data thread: the push under the current key is checked before the other.
  send_push(*job->worker_key(0));
  send_push(first_keys[0]);
  const absl::Time end = MonotonicNow() + absl::Seconds(5);
  while (aggs[0]->Counter("dlcp_rejects_total{reason=\"bad_mac\"}") < 1 && MonotonicNow() < end) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(aggs[0]->Counter("dlcp_rejects_total{reason=\"bad_mac\"}"), 1);
  for (auto& c : clients) EXPECT_TRUE(c->Close().ok());
}

// A regroup's layout is read from the session and handed to the engine later; keys that moved
// on in between must not be taken back by it. Here the engine hears of key 2 from an aggregator
// played by hand, then resumes after a regroup with a layout that still has key 1: its pushes
// must be signed with key 2, which is all the aggregator accepts once the rotation settles.
TEST(KeyRotation, ALayoutOlderThanTheKeysHeardOfDoesNotTakeThemBack) {
  constexpr uint32_t kJob = 91, kKey = 4, kEpoch = 2, kChunkBytes = 1024, kChunks = 6;
  const wire::MacKey k1{1, 2, 3, 4}, k2{5, 6, 7, 8};
  TransportOptions lo;
  lo.kind = TransportOptions::Kind::kLoopback;
  auto agg = CreateTransport(lo);
  ASSERT_TRUE(agg.ok()) << agg.status();
  EngineLayout layout;
  layout.epochs = {kEpoch};
  layout.keys = {k1};
  layout.previous_keys = {std::nullopt};
  layout.key_generations = {1};
  layout.endpoints = {{(*agg)->local_address()}};
  layout.sources = {{{}}};
  layout.aggregator_ids = {"hand"};
  EngineOptions o;
  static_cast<EngineLayout&>(o) = layout;
  o.job = kJob;
  o.chunk_bytes = kChunkBytes;
  o.retain_inputs = true;  // what a regroup needs
  o.repair_timeout = absl::Milliseconds(20);
  o.op_timeout = absl::Seconds(10);
  std::vector<float> data(kChunks * kChunkBytes / 4, 1.5f);
  std::promise<absl::StatusOr<RoundStats>> done;
  auto result = done.get_future();
  auto tx = CreateTransport(lo);
  ASSERT_TRUE(tx.ok()) << tx.status();
  TransferEngine engine(o, std::move(*tx));

  engine.UpdateKeys("hand", 2, k2, k1);
  ASSERT_TRUE(engine.PauseForRegroup(absl::Seconds(5)).ok());  // the I/O thread has turned since
  engine.Resume(layout, {});
  engine.Submit(kKey, absl::MakeSpan(data), AllReduceOptions{}, -1,
                [&](absl::StatusOr<RoundStats> r) { done.set_value(std::move(r)); });

  // Answer every push, signed with key 2, and count which key the pushes verify under.
  int under_k2 = 0, other = 0;
  std::vector<InMessage> batch;
  for (const absl::Time end = MonotonicNow() + absl::Seconds(10);
       result.wait_for(std::chrono::seconds(0)) != std::future_status::ready && MonotonicNow() < end;) {
    ASSERT_TRUE((*agg)->Receive(&batch, absl::Milliseconds(5)).ok());
    for (const InMessage& m : batch) {
      wire::Header h;
      ASSERT_EQ(wire::ParseHeader(absl::MakeConstSpan(m.data, m.len), &h), wire::Reject::kNone);
      if (h.type != wire::MsgType::kPush) continue;
      if (!wire::VerifyMac(k2, absl::MakeConstSpan(m.data, m.len), h.payload_len)) {
        ++other;
        continue;
      }
      ++under_k2;
      wire::Header r = h;
      r.type = wire::MsgType::kResult;
      r.contributors = 1;
      r.flags = wire::kFlagMac;
      uint8_t header[wire::kHeaderSize], tag[wire::kMacSize];
      wire::EncodeHeader(r, header);
      const uint8_t* payload = m.data + wire::kHeaderSize;
      wire::ComputeMac(k2, header, payload, r.payload_len, tag);
      OutMessage out{m.from, 1, header, wire::kHeaderSize, payload, r.payload_len, tag, wire::kMacSize};
      ASSERT_TRUE((*agg)->Send({&out, 1}, MonotonicNow() + absl::Seconds(1)).ok());
    }
  }
  EXPECT_EQ(other, 0);
  EXPECT_GE(under_k2, static_cast<int>(kChunks));
  ASSERT_EQ(result.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  absl::StatusOr<RoundStats> stats = result.get();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(data, std::vector<float>(data.size(), 1.5f));
}

}  // namespace
}  // namespace dlcp::testing
