#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "server/jobs/job_registry.h"

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

// Join creates a job before it records the member; a reap in between must not take the job (it
// did, on a slow machine: the joiner's next heartbeat then found itself a stranger to the job).
// A job with no member heard from yet counts as heard from at its creation.
TEST(JobRegistry, AJobIsNotReapedBeforeItsIdleTimeHasPassedSinceItsCreation) {
  JobRegistry jobs(JobLimits{});
  auto job = jobs.Join({"young", 2, 0, 1024, Address{0x7f000001, 5000}});
  ASSERT_TRUE(job.ok());
  // Its only member removed (silent past the deadline): no joined member is left to date it.
  const int64_t now = MonotonicNanos();
  (*job)->members[0].last_heartbeat_ns.store(now - absl::ToInt64Nanoseconds(absl::Seconds(10)));
  ASSERT_FALSE(jobs.FailSilentMembers(now, absl::Seconds(3)).empty());
  ASSERT_FALSE((*job)->members[0].joined());
  EXPECT_TRUE(jobs.ReapIdle(now, absl::Seconds(60)).empty());
  EXPECT_NE(jobs.Find((*job)->id), nullptr);
  const int64_t later = (*job)->created_ns + absl::ToInt64Nanoseconds(absl::Seconds(61));
  EXPECT_EQ(jobs.ReapIdle(later, absl::Seconds(60)), std::vector<std::string>{"young"});
}

// One client cannot take every job slot: past --max-jobs-per-client its next new job is refused,
// naming it and the setting, while other clients still get theirs; once one of its jobs ends it
// may start another. A job every member of which went silent frees its slot at the heartbeat
// deadline, not the idle one.
TEST(JobRegistry, OneClientCannotTakeEveryJobSlot) {
  JobLimits limits;
  limits.max_jobs_per_client = 2;
  JobRegistry jobs(limits);
  auto spec = [](const std::string& name, const std::string& client) {
    JoinSpec s{name, 1, 0, 1024, Address{0x7f000001, 5000}};
    s.client = client;
    return s;
  };
  ASSERT_TRUE(jobs.Join(spec("a1", "address 10.0.0.1")).ok());
  auto a2 = jobs.Join(spec("a2", "address 10.0.0.1"));
  ASSERT_TRUE(a2.ok());
  auto a3 = jobs.Join(spec("a3", "address 10.0.0.1"));
  EXPECT_EQ(a3.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a3.status().message(),
            "job 'a3' refused: address 10.0.0.1 already created 2 of the jobs this aggregator serves, its limit "
            "(dlcpd --max-jobs-per-client); one of them must end first");
  EXPECT_TRUE(jobs.Join(spec("b1", "address 10.0.0.2")).ok());
  EXPECT_TRUE(jobs.Join(spec("a1", "address 10.0.0.1")).ok());  // joining a job it has is no new one
  ASSERT_TRUE(jobs.Leave((*a2)->id, 0).ok());
  EXPECT_TRUE(jobs.Join(spec("a3", "address 10.0.0.1")).ok());

  // a1's only member goes silent: removed at the heartbeat deadline, then the job with it.
  std::shared_ptr<Job> a1 = jobs.Find(JobIdForName("a1"));
  ASSERT_NE(a1, nullptr);
  const int64_t later = a1->created_ns + absl::ToInt64Nanoseconds(limits.heartbeat_timeout + absl::Seconds(1));
  ASSERT_FALSE(jobs.FailSilentMembers(later, limits.heartbeat_timeout).empty());
  const int64_t reap_at = later + absl::ToInt64Nanoseconds(limits.heartbeat_timeout);
  const std::vector<std::string> reaped = jobs.ReapIdle(reap_at, absl::Seconds(60));
  EXPECT_NE(std::find(reaped.begin(), reaped.end(), "a1"), reaped.end());
  EXPECT_TRUE(jobs.Join(spec("a4", "address 10.0.0.1")).ok());
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

TEST(JobRegistry, KeepsTheReasonAWorkerGaveForLeaving) {
  JobRegistry jobs(JobLimits{});
  Address a0{0x7f000001, 5000}, a1{0x7f000001, 5001};
  auto job = jobs.Join({"why", 2, 0, 1024, a0});
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(jobs.Join({"why", 2, 1, 1024, a1}).ok());
  EXPECT_EQ((*job)->LeftBecause(1), "");
  ASSERT_TRUE(jobs.Leave((*job)->id, 1, "UNAVAILABLE: aggregator 10.0.0.9:7000 unreachable").ok());
  EXPECT_EQ((*job)->LeftBecause(1), "UNAVAILABLE: aggregator 10.0.0.9:7000 unreachable");
  EXPECT_EQ((*job)->LeftBecause(0), "");
  EXPECT_EQ((*job)->LeftBecause(7), "");  // outside the job: nothing, not a crash
}

TEST(JobRegistry, ASilentMemberFailsItsJobUntilItRejoinsOrEveryoneLeaves) {
  JobRegistry jobs(JobLimits{});
  Address a0{0x7f000001, 5000}, a1{0x7f000001, 5001};
  auto job = jobs.Join({"train", 2, 0, 1024, a0});
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(jobs.Join({"train", 2, 1, 1024, a1}).ok());
  const uint32_t first_epoch = (*job)->epoch;
  const int64_t t0 = MonotonicNanos();
  (*job)->members[0].last_heartbeat_ns.store(t0 + absl::ToInt64Nanoseconds(absl::Seconds(10)));
  EXPECT_TRUE(jobs.FailSilentMembers(t0 + absl::ToInt64Nanoseconds(absl::Seconds(2)), absl::Seconds(3)).empty());
  auto lines = jobs.FailSilentMembers(t0 + absl::ToInt64Nanoseconds(absl::Seconds(5)), absl::Seconds(3));
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("rank 1"), std::string::npos) << lines[0];
  EXPECT_TRUE((*job)->failed.load());
  EXPECT_NE((*job)->failure_reason().find("rank 1"), std::string::npos);
  EXPECT_FALSE((*job)->members[1].joined());
  EXPECT_EQ(jobs.Heartbeat((*job)->id, 1).code(), absl::StatusCode::kFailedPrecondition);

  // While it waits, a joiner is told the epoch the job will go on in.
  const uint32_t successor = (*job)->SuccessorEpoch();
  EXPECT_NE(successor, first_epoch);
  EXPECT_EQ((*job)->EpochForJoiner(), std::make_pair(successor, 1u));
  // The restarted rank 1 joins again: every rank is back, and the job goes on in that epoch.
  auto back = jobs.Join({"train", 2, 1, 1024, a1});
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->get(), job->get());
  EXPECT_FALSE((*job)->failed.load());
  EXPECT_EQ((*job)->failure_reason(), "");
  EXPECT_EQ((*job)->epoch.load(), successor);
  EXPECT_EQ((*job)->rejoins.load(), 1u);
  EXPECT_TRUE(jobs.Heartbeat((*job)->id, 1).ok());
  // A member joining again while the job is healthy changes nothing.
  ASSERT_TRUE(jobs.Join({"train", 2, 0, 1024, a0}).ok());
  EXPECT_EQ((*job)->epoch.load(), successor);
  // A new process under a rank still counted (a restart faster than the deadline) is a restart
  // too: the job goes on in another epoch.
  ASSERT_TRUE(jobs.Join({"train", 2, 0, 1024, Address{0x7f000001, 5002}}).ok());
  EXPECT_FALSE((*job)->failed.load());
  EXPECT_EQ((*job)->rejoins.load(), 2u);
  EXPECT_NE((*job)->epoch.load(), successor);

  // Failed again, and this time everyone leaves: the name starts a new incarnation.
  (*job)->Fail("test");
  ASSERT_TRUE(jobs.Leave((*job)->id, 0).ok());
  ASSERT_TRUE(jobs.Leave((*job)->id, 1).ok());
  auto fresh = jobs.Join({"train", 2, 1, 1024, a1});
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_NE(fresh->get(), job->get());
  EXPECT_FALSE((*fresh)->failed.load());
  EXPECT_EQ((*fresh)->rejoins.load(), 0u);
}

}  // namespace
}  // namespace dlcp::server

namespace dlcp::server {
namespace {

JoinSpec StageJoin(uint32_t rank, std::vector<uint32_t> group) {
  JoinSpec s{"staged", 4, rank, 1024, Address{0x7f000001, static_cast<uint16_t>(5000 + rank)}};
  s.host_group = std::move(group);
  return s;
}

TEST(JobRegistry, HostGroupsAreCheckedAndEveryRankOfOneMustGiveTheSame) {
  JobRegistry jobs(JobLimits{});
  EXPECT_EQ(jobs.Join(StageJoin(0, {0})).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(jobs.Join(StageJoin(0, {1, 0})).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(jobs.Join(StageJoin(0, {1, 2})).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(jobs.Join(StageJoin(0, {0, 4})).status().code(), absl::StatusCode::kInvalidArgument);
  auto job = jobs.Join(StageJoin(0, {0, 1}));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(jobs.Join(StageJoin(1, {0, 1})).ok());
  absl::Status other = jobs.Join(StageJoin(1, {0, 1, 2})).status();
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(other.message().find("[0,1,2] differs from [0,1]"), std::string::npos) << other;
  ASSERT_NE((*job)->HostGroupLedBy(0), nullptr);
  EXPECT_EQ(*(*job)->HostGroupLedBy(0), (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ((*job)->HostGroupLedBy(1), nullptr);
  EXPECT_TRUE((*job)->Carried(1));
  EXPECT_FALSE((*job)->Carried(0));
  EXPECT_FALSE((*job)->Carried(2));
}

}  // namespace
}  // namespace dlcp::server
