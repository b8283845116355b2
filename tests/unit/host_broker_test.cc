// dlcpd's host broker (server/host/host_broker.h) in process, with workers' requests from
// client/host/stage_join.h and their StageKeepers: a stage that lost a worker forms again around
// the workers that asked on standby, whenever the lost rank comes back, its memory counted until
// let go, and the keepers take it when the job goes on.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/host/host_stage.h"
#include "client/host/stage_join.h"
#include "client/host/stage_keeper.h"
#include "common/base/clock.h"
#include "common/metrics/registry.h"
#include "common/shm/stage_layout.h"
#include "server/host/host_broker.h"

namespace dlcp {
namespace {

constexpr uint64_t kSlot = 64 << 10;

class HostBrokerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.socket_path = absl::StrCat("/tmp/dlcp-broker-test-", getpid(), ".sock");
    options_.slot_bytes = kSlot;
    options_.gather_timeout = absl::Milliseconds(300);
    auto broker = server::HostBroker::Start(options_, &metrics_);
    ASSERT_TRUE(broker.ok()) << broker.status();
    broker_ = std::move(*broker);
  }

  StageJoinOptions Join(uint32_t rank, uint32_t local_size, bool standby = false,
                        const std::string& job = "job") const {
    StageJoinOptions o;
    o.socket_path = options_.socket_path;
    o.hello = HostHello{job, 8, rank, local_size, standby};
    o.timeout = absl::Seconds(10);
    return o;
  }

  double Gauge(const std::string& name) const { return metrics_.Snapshot()[name]; }

  // Waits (by `within`) for `done`; false if it never came.
  static bool Eventually(const std::function<bool()>& done, absl::Duration within = absl::Seconds(5)) {
    const absl::Time deadline = MonotonicNow() + within;
    while (!done()) {
      if (MonotonicNow() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return true;
  }

  server::HostBrokerOptions options_;
  MetricsRegistry metrics_;
  std::unique_ptr<server::HostBroker> broker_;
};

TEST_F(HostBrokerTest, AStageThatLostAWorkerFormsAgainAroundItsStandbyWorkersWheneverTheRankComesBack) {
  std::vector<std::future<absl::StatusOr<StageMembership>>> joining;
  for (uint32_t rank = 0; rank < 3; ++rank) {
    joining.push_back(std::async(std::launch::async, [this, rank] { return JoinHostStage(Join(rank, 3)); }));
  }
  std::vector<StageMembership> first;
  for (auto& j : joining) {
    absl::StatusOr<StageMembership> m = j.get();
    ASSERT_TRUE(m.ok()) << m.status();
    first.push_back(std::move(*m));
  }
  const double region_bytes = static_cast<double>(StageRegionBytes(3, kSlot));
  EXPECT_EQ(Gauge("dlcp_host_shm_bytes"), region_bytes);

  first[1].socket = OwnedFd();  // rank 1's process ends
  const auto* old_header = static_cast<const StageHeader*>(first[0].region.data());
  ASSERT_TRUE(Eventually([&] { return old_header->gone[1].load() == 1; })) << "rank 1 was not marked gone";

  // The survivors ask on standby; no answer comes, and none expires, until rank 1 is back.
  std::vector<OwnedFd> standby;
  for (uint32_t rank : {0u, 2u}) {
    absl::StatusOr<OwnedFd> request = RequestHostStage(Join(rank, 3, /*standby=*/true));
    ASSERT_TRUE(request.ok()) << request.status();
    standby.push_back(std::move(*request));
  }
  absl::SleepFor(options_.gather_timeout * 2);  // past the gather timeout
  for (size_t i = 0; i < standby.size(); ++i) {
    absl::StatusOr<StageMembership> none = AwaitHostStage(standby[i], Join(i * 2, 3), MonotonicNow());
    EXPECT_TRUE(absl::IsDeadlineExceeded(none.status())) << none.status();
    EXPECT_GE(standby[i].get(), 0) << "an unanswered request must stand";
  }

  absl::StatusOr<StageMembership> back = JoinHostStage(Join(1, 3));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->welcome.ranks, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_EQ(back->welcome.member, 1u);
  // Their answers came before rank 1's, so they are there without a wait.
  for (size_t i = 0; i < standby.size(); ++i) {
    absl::StatusOr<StageMembership> again = AwaitHostStage(standby[i], Join(i * 2, 3), MonotonicNow());
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(again->welcome.member, i * 2);
    EXPECT_NE(again->region.data(), first[i * 2].region.data());
    EXPECT_EQ(static_cast<const StageHeader*>(again->region.data())->gone[1].load(), 0u);
  }
  EXPECT_EQ(Gauge("dlcp_host_stages_formed_total"), 2);
  // The lost stage's memory counts until its last member lets it go.
  EXPECT_EQ(Gauge("dlcp_host_shm_bytes"), 2 * region_bytes);
  first[0].socket = OwnedFd();
  first[2].socket = OwnedFd();
  EXPECT_TRUE(Eventually([&] { return Gauge("dlcp_host_shm_bytes") == region_bytes; })) << Gauge("dlcp_host_shm_bytes");
}

// A standby request has no deadline, but the gather it is in gets one from the first worker that
// waits; past it, the standby worker is refused too, with the reason, and its request is over.
TEST_F(HostBrokerTest, AStandbyRequestIsRefusedWithTheOthersWhenTheirGatherTimesOut) {
  absl::StatusOr<OwnedFd> request = RequestHostStage(Join(0, 3, /*standby=*/true));
  ASSERT_TRUE(request.ok()) << request.status();
  absl::StatusOr<StageMembership> alone = JoinHostStage(Join(1, 3));  // rank 2 never comes
  ASSERT_TRUE(absl::IsDeadlineExceeded(alone.status())) << alone.status();
  EXPECT_NE(alone.status().message().find("only 2 of the 3 workers"), std::string::npos) << alone.status();
  absl::StatusOr<StageMembership> refused = AwaitHostStage(*request, Join(0, 3), MonotonicNow() + absl::Seconds(5));
  EXPECT_EQ(refused.status().message(), alone.status().message());
  EXPECT_LT(request->get(), 0) << "an answered request is over";
}

// A worker that comes in place of one whose connection hung up, before dlcpd served the hang-up,
// is not refused as a second worker of that rank.
TEST_F(HostBrokerTest, ARankWhoseEarlierWorkerHungUpIsNotRefusedAsASecondOne) {
  for (int i = 0; i < 20; ++i) {
    const std::string job = absl::StrCat("job-", i);
    absl::StatusOr<OwnedFd> early = RequestHostStage(Join(0, 2, false, job));
    ASSERT_TRUE(early.ok()) << early.status();
    *early = OwnedFd();  // gone at once, and its place taken at once
    std::future<absl::StatusOr<StageMembership>> zero =
        std::async(std::launch::async, [this, job] { return JoinHostStage(Join(0, 2, false, job)); });
    absl::StatusOr<StageMembership> one = JoinHostStage(Join(1, 2, false, job));
    absl::StatusOr<StageMembership> z = zero.get();
    ASSERT_TRUE(z.ok()) << "try " << i << ": " << z.status();
    ASSERT_TRUE(one.ok()) << "try " << i << ": " << one.status();
  }
}

// Sums `values` over a whole-job stage of two through `keeper`'s current stage.
absl::StatusOr<RoundStats> SumThrough(const StageKeeper& keeper, std::vector<float>& values) {
  std::shared_ptr<HostStage> stage = keeper.Current();
  if (stage == nullptr) return absl::UnavailableError("no current stage");
  auto done = std::make_shared<std::promise<absl::StatusOr<RoundStats>>>();
  std::future<absl::StatusOr<RoundStats>> result = done->get_future();
  stage->Submit(7, absl::MakeSpan(values), AllReduceOptions{}, -1,
                [done](absl::StatusOr<RoundStats> r) { done->set_value(std::move(r)); });
  // The op's own deadline (10 s) ends it at the latest.
  if (result.wait_for(std::chrono::seconds(30)) != std::future_status::ready) {
    return absl::DeadlineExceededError("the op did not end by its deadline");
  }
  return result.get();
}

// Both workers' sums through their keepers' stages, at once; the first failure, if any.
absl::Status SumBoth(const StageKeeper& zero, const StageKeeper& one) {
  std::vector<float> a(1000, 1.0f), b(1000, 2.0f);
  auto other = std::async(std::launch::async, [&] { return SumThrough(one, b); });
  absl::StatusOr<RoundStats> mine = SumThrough(zero, a);
  absl::StatusOr<RoundStats> theirs = other.get();
  if (!mine.ok()) return mine.status();
  if (!theirs.ok()) return theirs.status();
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != 3.0f || b[i] != 3.0f) return absl::DataLossError(absl::StrCat("element ", i, ": ", a[i], ", ", b[i]));
  }
  return absl::OkStatus();
}

// Two workers of a stage that holds their whole job, each with its StageKeeper: rank 1 dies, rank
// 0 loses its stage and asks on standby; rank 1 comes back, the job goes on, and both sum through
// the stage formed again.
TEST_F(HostBrokerTest, AKeeperTakesTheStageFormedAgainWhenTheJobGoesOn) {
  std::atomic<int> lost{0};
  auto keeper_of = [&](StageMembership m, uint32_t rank) {
    StageKeeper::MakeStage make = [](StageMembership member, StageKeeper::Broken broken) {
      HostStage::Limits limits;
      limits.world = 2;
      limits.op_timeout = absl::Seconds(10);
      return std::make_unique<HostStage>(std::move(member), nullptr, nullptr, limits, std::move(broken));
    };
    return std::make_unique<StageKeeper>(std::move(m), Join(rank, 2), make,
                                         [&lost](const absl::Status&) { lost.fetch_add(1); });
  };
  auto joining = std::async(std::launch::async, [this] { return JoinHostStage(Join(1, 2)); });
  absl::StatusOr<StageMembership> m0 = JoinHostStage(Join(0, 2));
  absl::StatusOr<StageMembership> m1 = joining.get();
  ASSERT_TRUE(m0.ok() && m1.ok()) << m0.status() << " " << m1.status();
  std::unique_ptr<StageKeeper> zero = keeper_of(std::move(*m0), 0);
  std::unique_ptr<StageKeeper> one = keeper_of(std::move(*m1), 1);
  ASSERT_TRUE(SumBoth(*zero, *one).ok());

  one.reset();  // rank 1's process ends
  std::vector<float> alone(1000, 1.0f);
  absl::StatusOr<RoundStats> failed = SumThrough(*zero, alone);
  EXPECT_TRUE(absl::IsAborted(failed.status())) << failed.status();
  EXPECT_NE(failed.status().message().find("worker rank 1"), std::string::npos) << failed.status();
  ASSERT_TRUE(Eventually([&] { return lost.load() == 1; }));
  EXPECT_EQ(zero->Current(), nullptr) << "a lost stage carries no op";
  EXPECT_FALSE(zero->RejoinJob());  // the job going on before the rank came back with a stage
  EXPECT_EQ(zero->Current(), nullptr);

  absl::StatusOr<StageMembership> back = JoinHostStage(Join(1, 2));
  ASSERT_TRUE(back.ok()) << back.status();
  one = keeper_of(std::move(*back), 1);
  EXPECT_TRUE(zero->RejoinJob());
  ASSERT_NE(zero->Current(), nullptr) << "the stage formed again was not taken";
  EXPECT_TRUE(SumBoth(*zero, *one).ok());
  EXPECT_EQ(lost.load(), 1);
}

}  // namespace
}  // namespace dlcp
