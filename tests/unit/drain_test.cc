// Graceful shutdown at the control service: once draining, joins are refused as UNAVAILABLE,
// heartbeat answers say `draining`, DrainTracker::Untold lists exactly the members that have not
// heard it yet (neither told, nor gone), and Holding those that have not moved off.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/base/clock.h"
#include "server/jobs/job_registry.h"
#include "tests/unit/control_service_fixture.h"

namespace dlcp::server {
namespace {

class DrainTest : public ControlServiceTest {
 protected:
  absl::Status Join(const std::string& job, uint32_t world, uint32_t rank) {
    v1::JoinResponse resp;
    return service_->HandleJoin("ipv4:127.0.0.1:4000", JoinRequestFor(job, world, rank), &resp);
  }
  absl::StatusOr<bool> Heartbeat(const std::string& job, uint32_t rank) {
    v1::HeartbeatRequest req;
    req.set_job_id(JobIdForName(job));
    req.set_rank(rank);
    v1::HeartbeatResponse resp;
    if (absl::Status s = service_->HandleHeartbeat(req, &resp); !s.ok()) return s;
    return resp.draining();
  }
  std::vector<std::string> Untold() { return service_->drain().Untold(jobs_); }
};

TEST_F(DrainTest, TellsEachMemberOnceAndKnowsWhoIsLeft) {
  ASSERT_TRUE(Join("a", 2, 0).ok());
  ASSERT_TRUE(Join("a", 2, 1).ok());
  ASSERT_TRUE(Join("b", 1, 0).ok());
  ASSERT_EQ(Heartbeat("a", 0).value_or(true), false);  // not draining yet
  v1::Stats stats;
  ASSERT_TRUE(service_->HandleGetStats({}, &stats).ok());
  EXPECT_FALSE(stats.draining());
  EXPECT_TRUE(Untold().empty()) << "nothing to tell before draining begins";

  service_->drain().Begin();
  EXPECT_EQ(Untold().size(), 3u);
  ASSERT_TRUE(service_->HandleGetStats({}, &stats).ok());
  EXPECT_TRUE(stats.draining());

  // A new member, or a lost one probing to come back, is turned away as if nobody were there.
  absl::Status refused = Join("a", 2, 1);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(refused.message().find("agg-a is shutting down"), std::string::npos) << refused;
  EXPECT_EQ(Join("c", 1, 0).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(jobs_.List().size(), 2u) << "a refused join left a job behind";

  ASSERT_EQ(Heartbeat("a", 0).value_or(false), true);
  EXPECT_EQ(Untold(), (std::vector<std::string>{"job 'a' rank 1", "job 'b' rank 0"}));
  ASSERT_EQ(Heartbeat("a", 0).value_or(false), true);  // told again: still one entry
  EXPECT_EQ(Untold().size(), 2u);

  // Leaving needs no telling; a non-member's heartbeat is refused and tells nobody.
  ASSERT_TRUE(jobs_.Leave(JobIdForName("a"), 1).ok());
  EXPECT_EQ(Heartbeat("a", 1).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Untold(), std::vector<std::string>{"job 'b' rank 0"});
  ASSERT_EQ(Heartbeat("b", 0).value_or(false), true);
  EXPECT_TRUE(Untold().empty());
}

// A member that has moved off probes the aggregator with a join; until then it may still need it.
TEST_F(DrainTest, AMemberProbingToJoinAgainHasLetGo) {
  ASSERT_TRUE(Join("a", 2, 0).ok());
  ASSERT_TRUE(Join("a", 2, 1).ok());
  EXPECT_EQ(Join("a", 2, 1).code(), absl::StatusCode::kOk) << "joining again before the drain is a restart";
  EXPECT_TRUE(service_->drain().Holding(jobs_).empty()) << "nothing is held before draining begins";
  service_->drain().Begin();
  EXPECT_EQ(service_->drain().Holding(jobs_), (std::vector<std::string>{"job 'a' rank 0", "job 'a' rank 1"}));

  ASSERT_EQ(Heartbeat("a", 1).value_or(false), true);
  EXPECT_EQ(service_->drain().Holding(jobs_).size(), 2u) << "told is not moved off";
  EXPECT_EQ(Join("a", 2, 1).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(service_->drain().Holding(jobs_), std::vector<std::string>{"job 'a' rank 0"});
  // Strangers probing let nobody go: a member of another job, a rank outside this one.
  EXPECT_EQ(Join("b", 2, 0).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Join("a", 3, 2).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(service_->drain().Holding(jobs_), std::vector<std::string>{"job 'a' rank 0"});

  // A member that beats here again after all (its move was put off) holds on.
  ASSERT_EQ(Join("a", 2, 0).code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(service_->drain().Holding(jobs_).empty());
  ASSERT_EQ(Heartbeat("a", 0).value_or(false), true);
  EXPECT_EQ(service_->drain().Holding(jobs_), std::vector<std::string>{"job 'a' rank 0"});
  ASSERT_TRUE(jobs_.Leave(JobIdForName("a"), 0).ok());
  EXPECT_TRUE(service_->drain().Holding(jobs_).empty()) << "a member that left holds nothing";
}

TEST_F(DrainTest, AMemberRemovedAtTheHeartbeatDeadlineNeedsNoTelling) {
  ASSERT_TRUE(Join("silent", 2, 0).ok());
  ASSERT_TRUE(Join("silent", 2, 1).ok());
  service_->drain().Begin();
  ASSERT_EQ(Heartbeat("silent", 0).value_or(false), true);
  EXPECT_EQ(Untold(), std::vector<std::string>{"job 'silent' rank 1"});
  // Rank 1 said nothing for longer than the deadline: removed, and the job failed.
  const int64_t later = MonotonicNanos() + absl::ToInt64Nanoseconds(absl::Seconds(10));
  EXPECT_FALSE(jobs_.FailSilentMembers(later, absl::Seconds(3)).empty());
  EXPECT_TRUE(Untold().empty());
}

}  // namespace
}  // namespace dlcp::server
