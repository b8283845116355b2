#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "server/rounds/round.h"

namespace dlcp::server {
namespace {

std::shared_ptr<Job> MakeJob(uint32_t world, uint64_t budget = 1 << 30) {
  return std::make_shared<Job>(1, "j", world, 64 /*chunk bytes: 16 floats*/, budget, /*epoch=*/7);
}

TEST(Round, SumsEachContributionOnceAndCompletes) {
  BlockPool pool(1 << 20);
  auto job = MakeJob(3);
  Round r(job, 5, 0, wire::ChunkGeometry{40, 16}, &pool, MonotonicNow());  // chunks of 16, 16, 8
  EXPECT_EQ(job->rounds_in_flight.load(), 1u);
  std::vector<float> a(16, 1.0f), b(16, 2.0f), c(16, 4.0f);
  EXPECT_EQ(r.Add(0, 1, a.data(), MonotonicNow()), Round::AddResult::kAdded);
  EXPECT_EQ(r.Add(0, 1, c.data(), MonotonicNow()), Round::AddResult::kDuplicate);
  EXPECT_EQ(r.Add(1, 1, b.data(), MonotonicNow()), Round::AddResult::kAdded);
  EXPECT_EQ(r.open_chunks(), 1u);
  EXPECT_EQ(r.MissingFrom(2), std::vector<uint32_t>{1});
  EXPECT_TRUE(r.MissingFrom(0).empty());
  EXPECT_EQ(r.Add(2, 1, c.data(), MonotonicNow()), Round::AddResult::kCompleted);
  EXPECT_TRUE(r.IsComplete(1));
  EXPECT_EQ(r.contributors(1), 3);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(r.Result(1)[i], 7.0f);
  EXPECT_EQ(r.open_chunks(), 0u);
  EXPECT_TRUE(r.MissingFrom(2).empty());
  // The short last chunk sums only its 8 elements.
  for (uint32_t w = 0; w < 3; ++w) r.Add(w, 2, a.data(), MonotonicNow());
  EXPECT_EQ(r.Result(2)[7], 3.0f);
}

TEST(Round, DoneTrackingAndRelease) {
  BlockPool pool(1 << 20);
  auto job = MakeJob(2);
  {
    Round r(job, 1, 0, wire::ChunkGeometry{16, 16}, &pool, MonotonicNow());
    std::vector<float> a(16, 1.0f);
    r.Add(0, 0, a.data(), MonotonicNow());
    EXPECT_GT(job->bytes_in_use.load(), 0u);
    r.MarkDone(1);
    r.MarkDone(1);
    EXPECT_FALSE(r.AllDone());
    r.MarkDone(0);
    EXPECT_TRUE(r.AllDone());
  }
  EXPECT_EQ(job->bytes_in_use.load(), 0u);
  EXPECT_EQ(job->rounds_in_flight.load(), 0u);
}

TEST(Round, KnowsWhichResultCopiesMayStillBeOnTheirWay) {
  BlockPool pool(1 << 20);
  auto job = MakeJob(2);
  const absl::Time t0 = MonotonicNow();
  Round r(job, 1, 0, wire::ChunkGeometry{48, 16}, &pool, t0);
  const absl::Duration interval = absl::Seconds(1);
  // Chunk 0 went to every worker, chunk 1 again to rank 1, chunk 2 never.
  r.results().NoteResultsSent(0, t0);
  r.results().NoteResultSentAgain(1, 1, t0);
  EXPECT_TRUE(r.results().ResultMayBeOnItsWay(0, 0, t0, interval));
  EXPECT_TRUE(r.results().ResultMayBeOnItsWay(1, 0, t0, interval));
  EXPECT_FALSE(r.results().ResultMayBeOnItsWay(0, 1, t0, interval));
  EXPECT_TRUE(r.results().ResultMayBeOnItsWay(1, 1, t0, interval));
  EXPECT_FALSE(r.results().ResultMayBeOnItsWay(0, 2, t0, interval));
  EXPECT_FALSE(r.results().ResultMayBeOnItsWay(1, 2, t0, interval));
  // A copy sent to everyone is given one interval; one sent again, two.
  EXPECT_FALSE(r.results().ResultMayBeOnItsWay(0, 0, t0 + interval, interval));
  EXPECT_TRUE(r.results().ResultMayBeOnItsWay(1, 1, t0 + interval, interval));
  EXPECT_FALSE(r.results().ResultMayBeOnItsWay(1, 1, t0 + 2 * interval, interval));
  // Each further copy doubles the wait, up to 4 intervals.
  const absl::Time t1 = t0 + absl::Seconds(10);
  r.results().NoteResultSentAgain(1, 1, t1);
  EXPECT_TRUE(r.results().ResultMayBeOnItsWay(1, 1, t1 + 3 * interval, interval));
  EXPECT_FALSE(r.results().ResultMayBeOnItsWay(1, 1, t1 + 4 * interval, interval));
  const absl::Time t2 = t1 + absl::Seconds(10);
  for (int i = 0; i < 10; ++i) r.results().NoteResultSentAgain(1, 1, t2);
  EXPECT_TRUE(r.results().ResultMayBeOnItsWay(1, 1, t2 + 3 * interval, interval));
  EXPECT_FALSE(r.results().ResultMayBeOnItsWay(1, 1, t2 + 4 * interval, interval));
  // The latest copy counts: one to everyone after those gets one interval.
  const absl::Time t3 = t2 + absl::Seconds(10);
  r.results().NoteResultsSent(1, t3);
  EXPECT_TRUE(r.results().ResultMayBeOnItsWay(1, 1, t3, interval));
  EXPECT_FALSE(r.results().ResultMayBeOnItsWay(1, 1, t3 + interval, interval));
}

TEST(Round, RefusesPastTheJobBudget) {
  BlockPool pool(1 << 20);
  auto job = MakeJob(2, /*budget=*/64 * 64);  // exactly one block of 64 chunks x 64 bytes
  Round r(job, 1, 0, wire::ChunkGeometry{16 * 200, 16}, &pool, MonotonicNow());
  std::vector<float> a(16, 1.0f);
  EXPECT_EQ(r.Add(0, 0, a.data(), MonotonicNow()), Round::AddResult::kAdded);
  EXPECT_EQ(r.Add(0, 64, a.data(), MonotonicNow()), Round::AddResult::kNoMemory);  // second block
}

TEST(Round, HandlesWorldsWiderThanOneBitmapWord) {
  BlockPool pool(1 << 20);
  auto job = MakeJob(130);
  Round r(job, 1, 0, wire::ChunkGeometry{16, 16}, &pool, MonotonicNow());
  std::vector<float> a(16, 1.0f);
  for (uint32_t w = 0; w < 129; ++w) ASSERT_EQ(r.Add(w, 0, a.data(), MonotonicNow()), Round::AddResult::kAdded);
  EXPECT_EQ(r.Add(128, 0, a.data(), MonotonicNow()), Round::AddResult::kDuplicate);
  EXPECT_EQ(r.Add(129, 0, a.data(), MonotonicNow()), Round::AddResult::kCompleted);
  EXPECT_EQ(r.Result(0)[0], 130.0f);
}

}  // namespace
}  // namespace dlcp::server

namespace dlcp::server {
namespace {

// A host stage's first rank pushes for its whole stage (docs/host-stage.md): its one push counts
// for each rank of the group, which get their results and say DONE through it.
TEST(Round, AHostStagesPushCountsForEachOfItsRanks) {
  BlockPool pool(1 << 20);
  auto job = MakeJob(5);
  auto group = std::make_shared<const std::vector<uint32_t>>(std::vector<uint32_t>{1, 2, 4});
  Round r(job, 5, 0, wire::ChunkGeometry{16, 16}, &pool, MonotonicNow());
  std::vector<float> host(16, 3.0f), other(16, 1.0f);
  EXPECT_EQ(r.Add(1, 0, host.data(), MonotonicNow(), group), Round::AddResult::kAdded);
  EXPECT_EQ(r.contributors(0), 3);
  EXPECT_TRUE(r.Carried(2) && r.Carried(4));
  EXPECT_FALSE(r.Carried(1) || r.Carried(0) || r.Carried(3));
  EXPECT_EQ(r.MissingFrom(0), std::vector<uint32_t>{0});
  EXPECT_TRUE(r.MissingFrom(4).empty());
  EXPECT_EQ(r.Add(1, 0, host.data(), MonotonicNow(), group), Round::AddResult::kDuplicate);
  EXPECT_EQ(r.Add(4, 0, other.data(), MonotonicNow()), Round::AddResult::kDuplicate);  // carried already
  EXPECT_EQ(r.Add(0, 0, other.data(), MonotonicNow()), Round::AddResult::kAdded);
  EXPECT_EQ(r.Add(3, 0, other.data(), MonotonicNow()), Round::AddResult::kCompleted);
  EXPECT_EQ(r.contributors(0), 5);
  EXPECT_EQ(r.Result(0)[0], 5.0f);
  r.MarkDone(0);
  r.MarkDone(3);
  EXPECT_FALSE(r.AllDone());
  r.MarkDone(1);
  EXPECT_TRUE(r.AllDone());
}

// Under a loss bound the stage's push is each of its ranks' contribution to the tracker too,
// whether the round turned bounded before or after it; its ranks are carried from the stage's
// manifest on (CarryGroup), and their repairs go to its first rank.
TEST(Round, AHostStagesPushCountsForEachOfItsRanksUnderALossBound) {
  BlockPool pool(1 << 20);
  auto job = MakeJob(4);
  auto group = std::make_shared<const std::vector<uint32_t>>(std::vector<uint32_t>{0, 1});
  Round r(job, 5, 0, wire::ChunkGeometry{32, 16}, &pool, MonotonicNow());  // two chunks
  std::vector<float> host(16, 3.0f);
  EXPECT_EQ(r.Add(0, 0, host.data(), MonotonicNow(), group), Round::AddResult::kAdded);
  LossTracker& t = r.EnableBounded();  // the manifest after the first push
  EXPECT_TRUE(t.got(0, 0) && t.got(1, 0));
  EXPECT_EQ(r.Add(0, 1, host.data(), MonotonicNow(), group), Round::AddResult::kAdded);  // after it
  EXPECT_TRUE(t.got(0, 1) && t.got(1, 1));
  EXPECT_FALSE(t.got(2, 1));
  EXPECT_EQ(r.CarrierOf(1), 0u);
  EXPECT_EQ(r.CarrierOf(2), 2u);

  Round fresh(job, 6, 0, wire::ChunkGeometry{32, 16}, &pool, MonotonicNow());
  EXPECT_FALSE(fresh.Carried(1));
  fresh.CarryGroup(group);  // the stage's manifest, before any push
  fresh.CarryGroup(group);
  EXPECT_TRUE(fresh.Carried(1));
  EXPECT_FALSE(fresh.Carried(0) || fresh.Carried(2));
  EXPECT_EQ(fresh.CarrierOf(1), 0u);
}

}  // namespace
}  // namespace dlcp::server
