// Under mutual TLS a job belongs to the certificate identity that created it: the control
// service refuses every worker call for it (Join, Heartbeat, Leave, GetTopology, Regroup) from
// another identity, naming both, and GetStats shows each job's owner. Without client
// certificates callers are addresses, which a job's workers do not share, so nothing is refused.
#include <gtest/gtest.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/jobs/job_registry.h"
#include "tests/unit/control_service_fixture.h"

namespace dlcp::server {
namespace {

constexpr char kOwner[] = "certificate 'team-a'";
constexpr char kStranger[] = "certificate 'team-b'";

class JobOwnerTest : public ControlServiceTest {
 protected:
  absl::Status Join(uint32_t rank, const std::string& client) {
    v1::JoinResponse resp;
    return service_->HandleJoin(absl::StrCat("ipv4:127.0.0.", rank + 1, ":4000"), JoinRequestFor("owned", 2, rank),
                                &resp, client);
  }
  absl::Status Heartbeat(const std::string& client) {
    v1::HeartbeatRequest req;
    req.set_job_id(JobIdForName("owned"));
    req.set_rank(0);
    v1::HeartbeatResponse resp;
    return service_->HandleHeartbeat(req, &resp, client);
  }
  absl::Status Topology(const std::string& client) {
    v1::GetTopologyRequest req;
    req.set_job_id(JobIdForName("owned"));
    v1::Topology resp;
    return service_->HandleGetTopology(req, &resp, client);
  }
  absl::Status Regroup(const std::string& client) {
    v1::RegroupRequest req;
    req.set_job_id(JobIdForName("owned"));
    req.set_rank(1);
    req.set_generation(1);
    v1::RegroupResponse resp;
    return service_->HandleRegroup(req, &resp, [](absl::Status) {}, client);
  }
  absl::Status Leave(const std::string& client) {
    v1::LeaveRequest req;
    req.set_job_id(JobIdForName("owned"));
    req.set_rank(0);
    return service_->HandleLeave(req, client);
  }
};

TEST_F(JobOwnerTest, AnotherIdentitysWorkerCallsAreRefusedNamingBoth) {
  ASSERT_TRUE(Join(0, kOwner).ok());
  const absl::Status join = Join(1, kStranger);
  EXPECT_EQ(join.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(join.message(),
            "job 'owned' belongs to certificate 'team-a', which created it here, and this call came from "
            "certificate 'team-b': give every worker of a job a certificate of the same identity, or choose another "
            "job name");
  EXPECT_EQ(Heartbeat(kStranger).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Topology(kStranger).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Regroup(kStranger).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Leave(kStranger).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Heartbeat("").code(), absl::StatusCode::kPermissionDenied);  // no identity is not the owner's
  // The stranger changed nothing: the owner's workers go on, and the job shows its owner.
  EXPECT_TRUE(Heartbeat(kOwner).ok());
  EXPECT_TRUE(Topology(kOwner).ok());
  ASSERT_TRUE(Join(1, kOwner).ok());
  v1::Stats stats;
  ASSERT_TRUE(service_->HandleGetStats(v1::GetStatsRequest(), &stats).ok());
  ASSERT_EQ(stats.jobs_size(), 1);
  EXPECT_EQ(stats.jobs(0).owner(), kOwner);
  EXPECT_EQ(stats.jobs(0).members(), 2u);
  EXPECT_TRUE(Leave(kOwner).ok());
}

TEST_F(JobOwnerTest, WithoutClientCertificatesWorkersFromManyAddressesShareAJob) {
  ASSERT_TRUE(Join(0, "address 127.0.0.1").ok());
  ASSERT_TRUE(Join(1, "address 127.0.0.2").ok());
  EXPECT_TRUE(Heartbeat("address 127.0.0.2").ok());
  v1::Stats stats;
  ASSERT_TRUE(service_->HandleGetStats(v1::GetStatsRequest(), &stats).ok());
  ASSERT_EQ(stats.jobs_size(), 1);
  EXPECT_EQ(stats.jobs(0).owner(), "address 127.0.0.1");
}

}  // namespace
}  // namespace dlcp::server
