// The client's transfer engine against an aggregator driven by hand over the loopback transport:
// what a worker asks for when its results stop coming, what it pushes again after a regroup, and
// what error feedback adds to a host stage's steps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <map>
#include <numeric>
#include <set>

#include "absl/time/clock.h"
#include "client/transfer_engine.h"
#include "common/base/clock.h"
#include "common/transport/factory.h"
#include "common/transport/transport.h"
#include "common/wire/bounded.h"
#include "common/wire/header.h"
#include "common/wire/ranges.h"

namespace dlcp::testing {
namespace {

constexpr uint32_t kJob = 77, kKey = 5, kEpoch = 3, kChunkBytes = 1024;
constexpr uint32_t kChunks = 12000, kElems = kChunks * kChunkBytes / 4;

// One aggregator endpoint of a one-worker job: it answers each push with its result (the sum of
// one contribution is the push), until told to go silent.
class HandAggregator {
 public:
  HandAggregator() {
    TransportOptions t;
    t.kind = TransportOptions::Kind::kLoopback;
    auto tx = CreateTransport(t);
    EXPECT_TRUE(tx.ok()) << tx.status();
    if (tx.ok()) transport_ = std::move(*tx);
  }
  Transport* transport() { return transport_.get(); }

  enum class Mode {
    kAnswer,  // every push, and every result asked for
    kLossy,   // every push but one in 20 (chunk % 20 == 7: its result is "lost"); no request
    kSilent,  // nothing
  };
  // Serves datagrams for up to `wait`, until `enough` says so, recording every result request.
  template <typename Enough>
  void Serve(absl::Duration wait, Mode mode, Enough enough) {
    const absl::Time deadline = MonotonicNow() + wait;
    std::vector<InMessage> batch;
    while (!enough() && MonotonicNow() < deadline) {
      ASSERT_TRUE(transport_->Receive(&batch, absl::Milliseconds(5)).ok());
      for (const InMessage& m : batch) Handle(m, mode);
    }
  }

  // Answers `count` pushes, the lowest not answered first, one every `gap` (as a slow path
  // delivers them), with `pause` more before the one after the first `pause_after`; takes in
  // pushes and records requests meanwhile, answering none. Returns when the last went, or after
  // 30 s without enough pushes to answer (a failure).
  absl::Time Trickle(size_t count, absl::Duration gap, size_t pause_after, absl::Duration pause) {
    std::vector<InMessage> batch;
    absl::Time next = MonotonicNow();
    const absl::Time deadline = next + absl::Seconds(30);
    size_t sent = 0;
    while (sent < count && MonotonicNow() < deadline) {
      EXPECT_TRUE(transport_->Receive(&batch, std::max(next - MonotonicNow(), absl::ZeroDuration())).ok());
      for (const InMessage& m : batch) Handle(m, Mode::kSilent);
      if (MonotonicNow() < next) continue;
      auto it = std::find_if(pushes_.begin(), pushes_.end(), [&](const auto& p) { return !answered_.count(p.first); });
      next = MonotonicNow() + gap;
      if (it == pushes_.end()) continue;  // nothing pushed yet
      Answer(it->second.from, it->first);
      if (++sent == pause_after) {
        next += pause;
        requests_before_pause = requests.size();
      }
    }
    EXPECT_EQ(sent, count) << "the worker stopped pushing";
    return MonotonicNow();
  }
  size_t requests_before_pause = 0;

  size_t answered() const { return answered_.size(); }
  // Chunks pushed whose result was not sent.
  size_t unanswered() const { return pushes_.size() - answered_.size(); }
  // Per result request with ranges: how many results it asked for, and how many were missing
  // (pushed, never answered) when it came.
  std::vector<std::pair<size_t, size_t>> requests;
  // Pushes taken in, by the ranks each said it carries (its header's `contributors`).
  std::map<uint16_t, size_t> pushes_by_contributors;
  // Forgets what was pushed and answered, for a round pushed again.
  void Forget() {
    pushes_.clear();
    answered_.clear();
    pushes_by_contributors.clear();
  }

 private:
  void Handle(const InMessage& m, Mode mode) {
    wire::Header h;
    ASSERT_EQ(wire::ParseHeader(absl::MakeConstSpan(m.data, m.len), &h), wire::Reject::kNone);
    ASSERT_EQ(h.job, kJob);
    const uint8_t* payload = m.data + wire::kHeaderSize;
    if (h.type == wire::MsgType::kPush) {
      ASSERT_EQ(h.payload_len, kChunkBytes);
      pushes_[h.chunk] = Pushed{m.from, std::vector<uint8_t>(payload, payload + h.payload_len)};
      ++pushes_by_contributors[h.contributors];
      if (mode == Mode::kAnswer || (mode == Mode::kLossy && h.chunk % 20 != 7)) Answer(m.from, h.chunk);
    } else if (h.type == wire::MsgType::kResultReq && !(h.flags & wire::kFlagDone)) {
      auto ranges = wire::DecodeRanges(absl::MakeConstSpan(payload, h.payload_len), kChunks);
      ASSERT_TRUE(ranges.ok()) << ranges.status();
      size_t asked = 0;
      for (const wire::ChunkRange& r : *ranges) asked += r.length;
      requests.emplace_back(asked, unanswered());
      if (mode != Mode::kAnswer) return;
      for (const wire::ChunkRange& r : *ranges) {
        for (uint32_t c = r.first; c < r.first + r.length; ++c) {
          if (pushes_.count(c)) Answer(m.from, c);
        }
      }
    }
  }

  void Answer(const Address& to, uint32_t chunk) {
    wire::Header h;
    h.type = wire::MsgType::kResult;
    h.priority = 1;
    h.job = kJob;
    h.key = kKey;
    h.round = 0;
    h.chunk = chunk;
    h.chunk_count = kChunks;
    h.tensor_elems = kElems;
    h.rank = 0;
    h.contributors = 1;
    h.epoch = kEpoch;
    h.payload_len = kChunkBytes;
    uint8_t header[wire::kHeaderSize];
    wire::EncodeHeader(h, header);
    const std::vector<uint8_t>& p = pushes_[chunk].payload;
    OutMessage out{to, 1, header, sizeof(header), p.data(), p.size()};
    ASSERT_TRUE(transport_->Send({&out, 1}, MonotonicNow() + absl::Seconds(1)).ok());
    answered_.insert(chunk);
  }

  std::unique_ptr<Transport> transport_;
  struct Pushed {
    Address from;
    std::vector<uint8_t> payload;
  };
  std::map<uint32_t, Pushed> pushes_;
  std::set<uint32_t> answered_;
};

// One op of key kKey over `agg`'s endpoint, on a tensor of counting values. The engine comes
// last, so that it is gone before the buffer and the promise it writes to, even if a test stops
// half-way.
struct OneOp {
  std::vector<float> data, input;
  std::promise<absl::StatusOr<RoundStats>> done;
  std::future<absl::StatusOr<RoundStats>> result = done.get_future();
  std::unique_ptr<TransferEngine> engine;

  bool Finished() { return result.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }
};
// One aggregator at `endpoint`, in epoch kEpoch, without MACs.
EngineLayout HandLayout(const Address& endpoint) {
  EngineLayout layout;
  layout.epochs = {kEpoch};
  layout.keys = {std::nullopt};
  layout.endpoints = {{endpoint}};
  layout.sources = {{{}}};
  layout.aggregator_ids = {"hand"};
  return layout;
}

// `window_chunks` and `repair_timeout` as given; the rest as a one-worker job of kJob needs. With
// `carries` > 1 the op is a host stage's sum; with `retain_inputs`, the engine keeps what a
// regroup pushes again.
void StartOneOp(HandAggregator& agg, uint32_t window_chunks, absl::Duration repair_timeout, OneOp* op,
                uint16_t carries = 1, bool retain_inputs = false) {
  EngineOptions o;
  static_cast<EngineLayout&>(o) = HandLayout(agg.transport()->local_address());
  o.job = kJob;
  o.chunk_bytes = kChunkBytes;
  o.window_chunks = window_chunks;
  o.repair_timeout = repair_timeout;
  o.op_timeout = absl::Seconds(30);
  // Every loss cuts: these tests shrink the window by losing results, with a round trip that does
  // not rise (which would otherwise read as random loss, and keep the window).
  o.congestion_delay = absl::ZeroDuration();
  o.retain_inputs = retain_inputs;
  op->data.resize(kElems);
  std::iota(op->data.begin(), op->data.end(), 0.0f);
  op->input = op->data;
  TransportOptions t;
  t.kind = TransportOptions::Kind::kLoopback;
  auto tx = CreateTransport(t);
  ASSERT_TRUE(tx.ok()) << tx.status();
  op->engine = std::make_unique<TransferEngine>(o, std::move(*tx));
  op->engine->Submit(kKey, absl::MakeSpan(op->data), AllReduceOptions{}, -1,
                     [op](absl::StatusOr<RoundStats> r) { op->done.set_value(std::move(r)); },
                     StageLeg{carries});
}

// A worker whose results stop coming asks for them again, once per quiet spell, and each request
// asks for at most what its window to that endpoint allows now (never below the initial 16), not
// the configured window. On the two-spine bed at MTU 1500, workers whose windows losses had cut
// to 4 asked for 3,000 results at a time; the bursts into 64-packet switch queues lost 90% of what
// came back, and rounds grew to 3-54 s (docs/congestion.md, "How much one request asks for").
TEST(ResultRequests, AskForTheWindowLeftNotTheConfiguredOne) {
  HandAggregator agg;
  ASSERT_NE(agg.transport(), nullptr);
  OneOp op;
  // The configured window: more than the requests below may ask for.
  ASSERT_NO_FATAL_FAILURE(StartOneOp(agg, 2000, absl::Milliseconds(20), &op));

  // Results come back for the first 1,000 chunks but one in 20: the losses keep the window near
  // its minimum (4). Then nothing comes back at all.
  agg.Serve(absl::Seconds(10), HandAggregator::Mode::kLossy, [&] { return agg.answered() >= 1000; });
  ASSERT_GE(agg.answered(), 1000u);
  agg.requests.clear();  // only the silence's count
  agg.Serve(absl::Seconds(10), HandAggregator::Mode::kSilent, [&] { return agg.requests.size() >= 8; });
  ASSERT_GE(agg.requests.size(), 8u);
  for (const auto& [asked, missing] : agg.requests) {
    ASSERT_GE(missing, 50u);  // every 20th of 1,000, and the window's pushes since
    // The configured window (2,000) would have asked for all of them.
    EXPECT_EQ(asked, 16u) << "of " << missing;
  }

  // Answered again, the round completes, exact.
  agg.Serve(absl::Seconds(10), HandAggregator::Mode::kAnswer, [&] { return op.Finished(); });
  ASSERT_TRUE(op.Finished());
  absl::StatusOr<RoundStats> stats = op.result.get();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(op.data, op.input);
  EXPECT_GE(stats->result_requests, 8u);
  EXPECT_GT(stats->window_cuts, 10u);
}

// A worker on a slow path (results 4 ms apart, where 16 gaps are 64 ms) does not take a pause
// shorter than its own gaps for silence, though the pause is longer than the 5 ms repair
// timeout: asking then would send again results still on their way (docs/congestion.md, "Slow
// paths"). Real silence still gets a request, after about 16 of its gaps. (Before 16 results
// have come, the 5 ms rule holds: a loaded machine may stall the trickle that long.)
TEST(ResultRequests, AWorkerOnASlowPathWaitsOutItsOwnGapsBeforeAskingAgain) {
  HandAggregator agg;
  ASSERT_NE(agg.transport(), nullptr);
  OneOp op;
  ASSERT_NO_FATAL_FAILURE(StartOneOp(agg, 512, absl::Milliseconds(5), &op));  // the defaults

  const absl::Time last = agg.Trickle(150, absl::Milliseconds(4), 60, absl::Milliseconds(12));
  const size_t before = agg.requests_before_pause;
  EXPECT_EQ(agg.requests.size(), before) << "asked again within its own gaps";
  agg.Serve(absl::Seconds(5), HandAggregator::Mode::kSilent, [&] { return agg.requests.size() > before; });
  ASSERT_GT(agg.requests.size(), before);
  EXPECT_GE(MonotonicNow() - last, absl::Milliseconds(40)) << "16 gaps of 4 ms";

  agg.Serve(absl::Seconds(10), HandAggregator::Mode::kAnswer, [&] { return op.Finished(); });
  ASSERT_TRUE(op.Finished());
  absl::StatusOr<RoundStats> stats = op.result.get();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(op.data, op.input);
}

// A host stage's first worker finished a round that another worker had not when an aggregator
// died: after the regroup it pushes that round again, and the pushes still say they carry its
// stage's ranks. Pushed as its own rank alone, the round would wait for the stage's other ranks,
// which never push, until the job's deadline.
TEST(RegroupReplay, AHostStagesRoundPushedAgainStillCarriesItsRanks) {
  HandAggregator agg;
  ASSERT_NE(agg.transport(), nullptr);
  OneOp op;
  ASSERT_NO_FATAL_FAILURE(StartOneOp(agg, 512, absl::Milliseconds(5), &op, /*carries=*/3, /*retain_inputs=*/true));
  agg.Serve(absl::Seconds(20), HandAggregator::Mode::kAnswer, [&] { return op.Finished(); });
  ASSERT_TRUE(op.Finished());
  ASSERT_TRUE(op.result.get().ok());
  EXPECT_EQ(agg.pushes_by_contributors, (std::map<uint16_t, size_t>{{3, kChunks}}));

  absl::StatusOr<std::vector<KeyProgress>> progress = op.engine->PauseForRegroup(absl::Seconds(5));
  ASSERT_TRUE(progress.ok()) << progress.status();
  ASSERT_EQ(progress->size(), 1u);
  EXPECT_EQ((*progress)[0].done, 1u);
  agg.Forget();
  // The slowest worker finished no round of the key, this one 1: it pushes round 0 again.
  op.engine->Resume(HandLayout(agg.transport()->local_address()), {KeyProgress{kKey, 0, 1}});
  agg.Serve(absl::Seconds(20), HandAggregator::Mode::kAnswer, [&] { return agg.answered() == kChunks; });
  EXPECT_EQ(agg.pushes_by_contributors, (std::map<uint16_t, size_t>{{3, kChunks}}));
}

// A host stage's network leg (StageLeg) keeps error feedback as any bounded op does: what the
// aggregators left out of the host's sum goes into the key's next round.
TEST(ErrorFeedback, AHostStagesLegCarriesWhatItsLastRoundLeftOut) {
  constexpr uint32_t kLegChunks = 4, kLegElems = kLegChunks * kChunkBytes / 4;
  TransportOptions lo;
  lo.kind = TransportOptions::Kind::kLoopback;
  auto agg = CreateTransport(lo);
  ASSERT_TRUE(agg.ok()) << agg.status();
  EngineOptions o;
  static_cast<EngineLayout&>(o) = HandLayout((*agg)->local_address());
  o.job = kJob;
  o.world = 2;
  o.chunk_bytes = kChunkBytes;
  o.rescale = false;
  o.op_timeout = absl::Seconds(10);
  auto tx = CreateTransport(lo);
  ASSERT_TRUE(tx.ok()) << tx.status();
  TransferEngine engine(o, std::move(*tx));
  AllReduceOptions bounded;
  bounded.loss_bound = 0.5;
  // One round of the leg: answers each push with its own values, chunk 0 marked left out when
  // `leave`. Returns what chunk 0's push carried.
  auto round = [&](float value, bool leave) -> float {
    std::vector<float> data(kLegElems, value);
    std::promise<absl::StatusOr<RoundStats>> done;
    auto result = done.get_future();
    engine.Submit(kKey, absl::MakeSpan(data), bounded, -1,
                  [&](absl::StatusOr<RoundStats> r) { done.set_value(std::move(r)); }, StageLeg{2});
    float pushed = -1;
    std::set<uint32_t> answered;
    std::vector<InMessage> batch;
    for (const absl::Time end = MonotonicNow() + absl::Seconds(10);
         result.wait_for(std::chrono::seconds(0)) != std::future_status::ready && MonotonicNow() < end;) {
      EXPECT_TRUE((*agg)->Receive(&batch, absl::Milliseconds(5)).ok());
      for (const InMessage& m : batch) {
        wire::Header h;
        EXPECT_EQ(wire::ParseHeader(absl::MakeConstSpan(m.data, m.len), &h), wire::Reject::kNone);
        if (h.type != wire::MsgType::kPush) continue;
        if (h.chunk == 0) std::memcpy(&pushed, m.data + wire::kHeaderSize, sizeof(float));
        wire::Header r = h;
        r.type = wire::MsgType::kResult;
        r.contributors = 2;
        r.flags = leave && h.chunk == 0 ? wire::kFlagLeftOut : 0;
        uint8_t header[wire::kHeaderSize];
        wire::EncodeHeader(r, header);
        OutMessage out{m.from, 1, header, sizeof(header), m.data + wire::kHeaderSize, h.payload_len};
        EXPECT_TRUE((*agg)->Send({&out, 1}, MonotonicNow() + absl::Seconds(1)).ok());
        answered.insert(h.chunk);
        if (answered.size() == kLegChunks) {  // the round is sealed: a bounded round ends at its STOP
          std::vector<wire::ChunkRange> left;
          if (leave) left.push_back({0, 1});
          for (const std::vector<uint8_t>& p : wire::EncodeStop(kLegChunks, leave ? 1 : 0, left, 1000)) {
            wire::Header stop = h;
            stop.type = wire::MsgType::kStop;
            stop.chunk = 0;
            stop.payload_len = static_cast<uint32_t>(p.size());
            wire::EncodeHeader(stop, header);
            OutMessage sealed{m.from, 1, header, sizeof(header), p.data(), p.size()};
            EXPECT_TRUE((*agg)->Send({&sealed, 1}, MonotonicNow() + absl::Seconds(1)).ok());
          }
        }
      }
    }
    EXPECT_EQ(result.wait_for(std::chrono::seconds(0)), std::future_status::ready);
    if (result.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
      absl::StatusOr<RoundStats> stats = result.get();
      EXPECT_TRUE(stats.ok()) << stats.status();
    }
    return pushed;
  };
  EXPECT_EQ(round(1.0f, /*leave=*/true), 1.0f);
  EXPECT_EQ(round(1.0f, false), 2.0f) << "the left-out value did not come back in the key's next round";
  EXPECT_EQ(round(1.0f, false), 1.0f) << "the left-out value came back twice";
}

}  // namespace
}  // namespace dlcp::testing
