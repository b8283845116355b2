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

namespace dlcp::server {
namespace {

TEST(JobRegistry, ReapsJobsWhoseMembersAllWentQuiet) {
  JobRegistry jobs(JobLimits{});
  JoinSpec a{"alive", 2, 0, 1024, Address{0x7f000001, 5000}};
  JoinSpec b{"dead", 1, 0, 1024, Address{0x7f000001, 5001}};
  auto ja = jobs.Join(a);
  auto jb = jobs.Join(b);
  ASSERT_TRUE(ja.ok() && jb.ok());
  const int64_t t0 = (*ja)->members[0].last_heartbeat_ns.load();
  (*ja)->members[0].last_heartbeat_ns.store(t0 + absl::ToInt64Nanoseconds(absl::Seconds(50)));
  auto reaped = jobs.ReapIdle(t0 + absl::ToInt64Nanoseconds(absl::Seconds(61)), absl::Seconds(60));
  ASSERT_EQ(reaped, std::vector<std::string>{"dead"});
  EXPECT_TRUE((*jb)->closed.load());
  EXPECT_EQ(jobs.Find((*jb)->id), nullptr);
  EXPECT_NE(jobs.Find((*ja)->id), nullptr);
}

TEST(JobRegistry, ValidatesJoinsAndEnforcesLimits) {
  JobLimits limits;
  limits.max_jobs = 1;
  limits.max_workers = 8;
  JobRegistry jobs(limits);
  Address addr{0x7f000001, 5000};
  EXPECT_EQ(jobs.Join({"", 2, 0, 1024, addr}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(jobs.Join({"j", 9, 0, 1024, addr}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(jobs.Join({"j", 2, 2, 1024, addr}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(jobs.Join({"j", 2, 0, 1001, addr}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(jobs.Join({"j", 2, 0, 1024, Address{1, 0}}).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(jobs.Join({"j", 2, 0, 1024, addr}).ok());
  EXPECT_EQ(jobs.Join({"k", 2, 0, 1024, addr}).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(jobs.Join({"j", 2, 1, 1024, addr}).ok());
  ASSERT_TRUE(jobs.Leave(JobIdForName("j"), 0).ok());
  ASSERT_TRUE(jobs.Leave(JobIdForName("j"), 1).ok());
  EXPECT_EQ(jobs.Find(JobIdForName("j")), nullptr);  // last member left: slot free again
  EXPECT_TRUE(jobs.Join({"k", 2, 0, 1024, addr}).ok());
}

}  // namespace
}  // namespace dlcp::server

namespace dlcp::server {
namespace {

TEST(JobRegistry, ASilentMemberFailsItsJobUntilEveryoneHasLeft) {
  JobRegistry jobs(JobLimits{});
  Address a0{0x7f000001, 5000}, a1{0x7f000001, 5001};
  auto job = jobs.Join({"train", 2, 0, 1024, a0});
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(jobs.Join({"train", 2, 1, 1024, a1}).ok());
  const uint32_t first_epoch = (*job)->epoch;
  const int64_t t0 = absl::GetCurrentTimeNanos();
  (*job)->members[0].last_heartbeat_ns.store(t0 + absl::ToInt64Nanoseconds(absl::Seconds(10)));
  EXPECT_TRUE(jobs.FailSilentMembers(t0 + absl::ToInt64Nanoseconds(absl::Seconds(2)), absl::Seconds(3)).empty());
  auto lines = jobs.FailSilentMembers(t0 + absl::ToInt64Nanoseconds(absl::Seconds(5)), absl::Seconds(3));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("rank 1"), std::string::npos) << lines[0];
  EXPECT_TRUE((*job)->failed.load());
  EXPECT_NE((*job)->failure_reason().find("rank 1"), std::string::npos);
  EXPECT_FALSE((*job)->members[1].joined());
  EXPECT_EQ(jobs.Heartbeat((*job)->id, 1).code(), absl::StatusCode::kFailedPrecondition);

  // The restarted rank 1 cannot join while rank 0 of the failed incarnation is still there.
  auto early = jobs.Join({"train", 2, 1, 1024, a1});
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(early.status().message().find("must leave"), std::string::npos) << early.status();

  // Once everyone has left, the name starts a new incarnation with another epoch.
  ASSERT_TRUE(jobs.Leave((*job)->id, 0).ok());
  auto fresh = jobs.Join({"train", 2, 1, 1024, a1});
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_FALSE((*fresh)->failed.load());
  EXPECT_NE((*fresh)->epoch, first_epoch);
}

}  // namespace
}  // namespace dlcp::server
