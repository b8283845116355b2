#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "server/rounds/round.h"

namespace dlcp::server {
namespace {

std::shared_ptr<Job> MakeJob(uint32_t world, uint64_t budget = 1 << 30) {
  return std::make_shared<Job>(1, "j", world, 64 /*chunk bytes: 16 floats*/, budget, /*epoch=*/7);
}

TEST(Round, SumsEachContributionOnceAndCompletes) {
  BlockPool pool(1 << 20);
  auto job = MakeJob(3);
  Round r(job, 5, 0, wire::ChunkGeometry{40, 16}, &pool, absl::Now());  // chunks of 16, 16, 8
  EXPECT_EQ(job->rounds_in_flight.load(), 1u);
  std::vector<float> a(16, 1.0f), b(16, 2.0f), c(16, 4.0f);
  EXPECT_EQ(r.Add(0, 1, a.data(), absl::Now()), Round::AddResult::kAdded);
  EXPECT_EQ(r.Add(0, 1, c.data(), absl::Now()), Round::AddResult::kDuplicate);
  EXPECT_EQ(r.Add(1, 1, b.data(), absl::Now()), Round::AddResult::kAdded);
  EXPECT_EQ(r.open_chunks(), 1u);
  EXPECT_EQ(r.MissingFrom(2), std::vector<uint32_t>{1});
  EXPECT_TRUE(r.MissingFrom(0).empty());
  EXPECT_EQ(r.Add(2, 1, c.data(), absl::Now()), Round::AddResult::kCompleted);
  EXPECT_TRUE(r.IsComplete(1));
  EXPECT_EQ(r.contributors(1), 3);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(r.Result(1)[i], 7.0f);
  EXPECT_EQ(r.open_chunks(), 0u);
  EXPECT_TRUE(r.MissingFrom(2).empty());
  // The short last chunk sums only its 8 elements.
  for (uint32_t w = 0; w < 3; ++w) r.Add(w, 2, a.data(), absl::Now());
  EXPECT_EQ(r.Result(2)[7], 3.0f);
}

TEST(Round, DoneTrackingAndRelease) {
  BlockPool pool(1 << 20);
  auto job = MakeJob(2);
  {
    Round r(job, 1, 0, wire::ChunkGeometry{16, 16}, &pool, absl::Now());
    std::vector<float> a(16, 1.0f);
    r.Add(0, 0, a.data(), absl::Now());
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
  Round r(job, 1, 0, wire::ChunkGeometry{48, 16}, &pool, absl::Now());
  const absl::Duration interval = absl::Minutes(1);
  // Chunk 0 went to every worker, chunk 1 again to rank 1, chunk 2 never.
  r.NoteResultsSent(0);
  r.NoteResultSentAgain(1, 1);
  absl::Time now = absl::Now();
  EXPECT_TRUE(r.ResultMayBeOnItsWay(0, 0, now, interval));
  EXPECT_TRUE(r.ResultMayBeOnItsWay(1, 0, now, interval));
  EXPECT_FALSE(r.ResultMayBeOnItsWay(0, 1, now, interval));
  EXPECT_TRUE(r.ResultMayBeOnItsWay(1, 1, now, interval));
  EXPECT_FALSE(r.ResultMayBeOnItsWay(0, 2, now, interval));
  EXPECT_FALSE(r.ResultMayBeOnItsWay(1, 2, now, interval));
  // A copy sent to everyone is given one interval; one sent again, two.
  EXPECT_FALSE(r.ResultMayBeOnItsWay(0, 0, now + interval, interval));
  EXPECT_TRUE(r.ResultMayBeOnItsWay(1, 1, now + interval, interval));
  EXPECT_FALSE(r.ResultMayBeOnItsWay(1, 1, now + 2 * interval, interval));
  // Each further copy doubles the wait, up to 4 intervals.
  r.NoteResultSentAgain(1, 1);
  now = absl::Now();
  EXPECT_TRUE(r.ResultMayBeOnItsWay(1, 1, now + 3 * interval, interval));
  EXPECT_FALSE(r.ResultMayBeOnItsWay(1, 1, now + 4 * interval, interval));
  for (int i = 0; i < 10; ++i) r.NoteResultSentAgain(1, 1);
  now = absl::Now();
  EXPECT_TRUE(r.ResultMayBeOnItsWay(1, 1, now + 3 * interval, interval));
  EXPECT_FALSE(r.ResultMayBeOnItsWay(1, 1, now + 4 * interval, interval));
  // A later copy to everyone (the round sealed) starts over at one interval.
  r.NoteResultsSent(1);
  EXPECT_FALSE(r.ResultMayBeOnItsWay(1, 1, absl::Now() + interval, interval));
}

TEST(Round, RefusesPastTheJobBudget) {
  BlockPool pool(1 << 20);
  auto job = MakeJob(2, /*budget=*/64 * 64);  // exactly one block of 64 chunks x 64 bytes
  Round r(job, 1, 0, wire::ChunkGeometry{16 * 200, 16}, &pool, absl::Now());
  std::vector<float> a(16, 1.0f);
  EXPECT_EQ(r.Add(0, 0, a.data(), absl::Now()), Round::AddResult::kAdded);
  EXPECT_EQ(r.Add(0, 64, a.data(), absl::Now()), Round::AddResult::kNoMemory);  // second block
}

TEST(Round, HandlesWorldsWiderThanOneBitmapWord) {
  BlockPool pool(1 << 20);
  auto job = MakeJob(130);
  Round r(job, 1, 0, wire::ChunkGeometry{16, 16}, &pool, absl::Now());
  std::vector<float> a(16, 1.0f);
  for (uint32_t w = 0; w < 129; ++w) ASSERT_EQ(r.Add(w, 0, a.data(), absl::Now()), Round::AddResult::kAdded);
  EXPECT_EQ(r.Add(128, 0, a.data(), absl::Now()), Round::AddResult::kDuplicate);
  EXPECT_EQ(r.Add(129, 0, a.data(), absl::Now()), Round::AddResult::kCompleted);
  EXPECT_EQ(r.Result(0)[0], 130.0f);
}

}  // namespace
}  // namespace dlcp::server
