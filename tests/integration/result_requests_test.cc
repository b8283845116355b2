// The client's transfer engine against an aggregator driven by hand over the loopback transport:
// what a worker asks for when its results stop coming.
#include <gtest/gtest.h>

#include <algorithm>
#include <future>
#include <map>
#include <numeric>
#include <set>

#include "absl/time/clock.h"
#include "client/transfer_engine.h"
#include "common/transport/transport.h"
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
    kSilent,  // nothing
  };
  // Serves datagrams for up to `wait`, until `enough` says so, recording every result request.
  template <typename Enough>
  void Serve(absl::Duration wait, Mode mode, Enough enough) {
    const absl::Time deadline = absl::Now() + wait;
    std::vector<InMessage> batch;
    while (!enough() && absl::Now() < deadline) {
      ASSERT_TRUE(transport_->Receive(&batch, absl::Milliseconds(5)).ok());
      for (const InMessage& m : batch) Handle(m, mode);
    }
  }

  size_t answered() const { return answered_.size(); }
  // Chunks pushed whose result was not sent.
  size_t unanswered() const { return pushes_.size() - answered_.size(); }
  // Per result request with ranges: how many results it asked for, and how many were missing
  // (pushed, never answered) when it came.
  std::vector<std::pair<size_t, size_t>> requests;

 private:
  void Handle(const InMessage& m, Mode mode) {
    wire::Header h;
    ASSERT_EQ(wire::ParseHeader(absl::MakeConstSpan(m.data, m.len), &h), wire::Reject::kNone);
    ASSERT_EQ(h.job, kJob);
    const uint8_t* payload = m.data + wire::kHeaderSize;
    if (h.type == wire::MsgType::kPush) {
      ASSERT_EQ(h.payload_len, kChunkBytes);
      pushes_[h.chunk].assign(payload, payload + h.payload_len);
      if (mode == Mode::kAnswer) Answer(m.from, h.chunk);
    } else if (h.type == wire::MsgType::kResultReq && !(h.flags & wire::kFlagDone)) {
      auto ranges = wire::DecodeRanges(absl::MakeConstSpan(payload, h.payload_len), kChunks);
      ASSERT_TRUE(ranges.ok()) << ranges.status();
      size_t asked = 0;
      for (const wire::ChunkRange& r : *ranges) asked += r.length;
      requests.emplace_back(asked, unanswered());
      if (mode == Mode::kSilent || ranges->empty()) return;
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
    const std::vector<uint8_t>& p = pushes_[chunk];
    OutMessage out{to, 1, header, sizeof(header), p.data(), p.size()};
    ASSERT_TRUE(transport_->Send({&out, 1}, absl::Now() + absl::Seconds(1)).ok());
    answered_.insert(chunk);
  }

  std::unique_ptr<Transport> transport_;
  std::map<uint32_t, std::vector<uint8_t>> pushes_;
  std::set<uint32_t> answered_;
};

// A worker whose results stop coming (a path gone black, or a queue losing everything) asks for
// them again once per quiet spell, and each quiet spell is a retransmission timeout: it frees the
// window and cuts it. Each request asks for at most what the window allows now (never below the
// initial 16), not the configured window: on the two-spine bed at MTU 1500, requests for 3,000
// results from windows cut to 4 burst into 64-packet switch queues, lost 90% of what came back,
// and made storms of 3-54 s rounds. And a released window was not cut: 375 more pushes went into
// the silence every spell, without end (docs/congestion.md, "How much one request asks for",
// "Quiet spells cut").
TEST(ResultRequests, QuietSpellsCutTheWindowAndWhatIsAskedFor) {
  HandAggregator agg;
  ASSERT_NE(agg.transport(), nullptr);
  EngineOptions o;
  o.epochs = {kEpoch};
  o.keys = {std::nullopt};
  o.endpoints = {{agg.transport()->local_address()}};
  o.sources = {{{}}};
  o.aggregator_ids = {"hand"};
  o.job = kJob;
  o.chunk_bytes = kChunkBytes;
  o.window_chunks = 2000;  // configured: more than the requests below may ask for
  o.repair_timeout = absl::Milliseconds(20);
  o.op_timeout = absl::Seconds(30);
  TransportOptions t;
  t.kind = TransportOptions::Kind::kLoopback;
  auto tx = CreateTransport(t);
  ASSERT_TRUE(tx.ok()) << tx.status();
  TransferEngine engine(o, std::move(*tx));

  std::vector<float> data(kElems);
  std::iota(data.begin(), data.end(), 0.0f);
  const std::vector<float> input = data;
  std::promise<absl::StatusOr<RoundStats>> done;
  auto result = done.get_future();
  engine.Submit(kKey, absl::MakeSpan(data), AllReduceOptions{}, -1,
                [&](absl::StatusOr<RoundStats> r) { done.set_value(std::move(r)); });

  // Results flow for the first 1,000 chunks, so the window opens wide; then nothing comes back.
  agg.Serve(absl::Seconds(10), HandAggregator::Mode::kAnswer, [&] { return agg.answered() >= 1000; });
  ASSERT_GE(agg.answered(), 1000u);
  // A request before this, if any, came of a quiet spell that only a busy machine made.
  agg.requests.clear();
  agg.Serve(absl::Seconds(10), HandAggregator::Mode::kSilent, [&] { return agg.requests.size() >= 8; });
  const auto& asks = agg.requests;
  ASSERT_GE(asks.size(), 8u);
  for (size_t i = 0; i < asks.size(); ++i) {
    const auto [asked, missing] = asks[i];
    SCOPED_TRACE(::testing::Message() << "request " << i << " asked for " << asked << " of " << missing);
    // Each quiet spell cut the window to 0.35 of itself: less asked each time, and never below
    // the initial window.
    if (i > 0) {
      EXPECT_LE(asked, asks[i - 1].first);
    }
    EXPECT_GE(asked, std::min<size_t>(16, missing));
  }
  // Down to the floor, though far more is missing (all of it, without the window).
  EXPECT_EQ(asks.back().first, 16u);
  EXPECT_GE(asks.back().second, 32u);
  // What goes out into the silence dwindles with the window (at least 4): a quiet spell is a
  // retransmission timeout, not a licence for another full window.
  for (size_t i = asks.size() - 3; i < asks.size(); ++i) EXPECT_LE(asks[i].second - asks[i - 1].second, 16u) << i;

  // Answered again, the round completes, exact.
  agg.Serve(absl::Seconds(10), HandAggregator::Mode::kAnswer,
            [&] { return result.wait_for(std::chrono::seconds(0)) == std::future_status::ready; });
  ASSERT_EQ(result.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  absl::StatusOr<RoundStats> stats = result.get();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(data, input);
  EXPECT_GE(stats->result_requests, 6u);
}

}  // namespace
}  // namespace dlcp::testing
