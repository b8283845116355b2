// A host stage's steps (client/host/stage_steps.h) between threads, each a member with its own
// mapping of one region, as processes have: exact sums over many steps, the first member's network
// leg, broadcasts bit for bit, and members that disagree, vanish or never come named.
#include "client/host/stage_steps.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "common/base/clock.h"
#include "common/shm/futex_bell.h"

namespace dlcp {
namespace {

constexpr uint64_t kSlotBytes = 64 << 10;

// A region set up as dlcpd sets it up, and each member's own view of it.
struct Stage {
  explicit Stage(std::vector<uint32_t> ranks) : ranks(std::move(ranks)) {
    auto created = SharedRegion::Create("test", StageRegionBytes(members(), kSlotBytes));
    EXPECT_TRUE(created.ok()) << created.status();
    region.emplace(std::move(*created));
    auto* h = new (region->data()) StageHeader{};
    h->magic = kStageMagic;
    h->version = kStageVersion;
    h->members = members();
    h->slot_bytes = kSlotBytes;
  }
  uint32_t members() const { return static_cast<uint32_t>(ranks.size()); }
  StageHeader& header() { return *static_cast<StageHeader*>(region->data()); }
  std::unique_ptr<StageSteps> Member(uint32_t i) {
    auto mapped = SharedRegion::Map(::dup(region->fd()), StageRegionBytes(members(), kSlotBytes));
    EXPECT_TRUE(mapped.ok()) << mapped.status();
    HostWelcome w;
    w.member = i;
    w.ranks = ranks;
    w.slot_bytes = kSlotBytes;
    return std::make_unique<StageSteps>(StageMembership{std::move(*mapped), w, OwnedFd()});
  }
  std::vector<uint32_t> ranks;
  std::optional<SharedRegion> region;
};

absl::Status NotInterrupted() { return absl::OkStatus(); }

TEST(StageSteps, MembersSumExactlyOverManyStepsWithTheFirstOnesNetworkLeg) {
  Stage stage({4, 5, 9});
  const uint64_t slot_elems = kSlotBytes / 4;
  std::vector<std::thread> threads;
  std::vector<int> failures(3, 0);
  for (uint32_t m = 0; m < 3; ++m) {
    threads.emplace_back([&, m] {
      std::unique_ptr<StageSteps> steps = stage.Member(m);
      // The other hosts' part, as the aggregators would add it.
      NetworkLeg leg = [](float* sum, const StepSpec& s) {
        for (uint64_t i = 0; i < s.elems; ++i) sum[i] += 1000.0f;
        return absl::OkStatus();
      };
      for (uint32_t step = 0; step < 300; ++step) {
        const uint64_t elems = 1 + (step * 7919) % slot_elems;
        std::vector<float> data(elems);
        for (uint64_t i = 0; i < elems; ++i) data[i] = static_cast<float>((m + 1) * (i % 97) + step);
        const StepSpec spec{step % 5, 0, 0, elems, elems};
        absl::Status s = steps->Run(spec, data.data(), data.data(), m == 0 ? leg : nullptr,
                                    MonotonicNow() + absl::Seconds(30), NotInterrupted);
        if (!s.ok()) ADD_FAILURE() << "member " << m << " step " << step << ": " << s;
        for (uint64_t i = 0; i < elems; ++i) {
          const float want = static_cast<float>(6 * (i % 97) + 3 * step) + 1000.0f;
          if (data[i] != want && failures[m]++ < 3) ADD_FAILURE() << "member " << m << " step " << step << " [" << i << "]";
        }
      }
    });
  }
  for (auto& t : threads) t.join();
}

TEST(StageSteps, ABroadcastCarriesTheRootsBitsExactly) {
  Stage stage({0, 1});
  const std::vector<float> root_values = {-0.0f, std::nanf("0x123"), 1e-45f, -3.5f};
  std::vector<std::vector<float>> out(2, std::vector<float>(4, 7.0f));
  out[1] = root_values;
  std::vector<std::thread> threads;
  for (uint32_t m = 0; m < 2; ++m) {
    threads.emplace_back([&, m] {
      const StepSpec spec{3, 1 + 1 /* from rank 1 */, 0, 4, 4};
      absl::Status s = stage.Member(m)->Run(spec, out[m].data(), out[m].data(), nullptr,
                                            MonotonicNow() + absl::Seconds(30), NotInterrupted);
      EXPECT_TRUE(s.ok()) << s;
    });
  }
  for (auto& t : threads) t.join();
  for (uint32_t m = 0; m < 2; ++m) EXPECT_EQ(std::memcmp(out[m].data(), root_values.data(), 16), 0) << m;
}

TEST(StageSteps, MembersThatRunDifferentOpsAllFailNamingThemAndTheNextStepWorks) {
  Stage stage({0, 1, 2});
  std::vector<std::thread> threads;
  for (uint32_t m = 0; m < 3; ++m) {
    threads.emplace_back([&, m] {
      std::unique_ptr<StageSteps> steps = stage.Member(m);
      std::vector<float> data(16, 1.0f);
      const StepSpec wrong{m == 2 ? 9u : 7u, 0, 0, 16, 16};
      absl::Status s = steps->Run(wrong, data.data(), data.data(), nullptr, MonotonicNow() + absl::Seconds(30),
                                  NotInterrupted);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << m << ": " << s;
      EXPECT_NE(s.message().find("key 9"), std::string::npos) << s;
      const StepSpec right{8, 0, 0, 16, 16};
      s = steps->Run(right, data.data(), data.data(), nullptr, MonotonicNow() + absl::Seconds(30), NotInterrupted);
      EXPECT_TRUE(s.ok()) << m << ": " << s;
      EXPECT_EQ(data[15], 3.0f);
    });
  }
  for (auto& t : threads) t.join();
}

// A member whose op already failed gives the step up at once (Skip): the others fail that step
// too, giving its reason (StageNotice), and every member is in step for the next.
TEST(StageSteps, AStepOneMemberGivesUpFailsForAllAndTheNextOneWorks) {
  Stage stage({3, 4, 5});
  std::vector<std::thread> threads;
  for (uint32_t m = 0; m < 3; ++m) {
    threads.emplace_back([&, m] {
      std::unique_ptr<StageSteps> steps = stage.Member(m);
      std::vector<float> data(16, 1.0f);
      const StepSpec spec{4, 0, 0, 16, 16};
      absl::Status s = m == 1 ? steps->Skip(spec, absl::AbortedError("its job failed"))
                              : steps->Run(spec, data.data(), data.data(), nullptr,
                                           MonotonicNow() + absl::Seconds(30), NotInterrupted);
      EXPECT_FALSE(s.ok()) << m;
      if (m != 1) {
        EXPECT_EQ(s, absl::AbortedError("its job failed")) << m;
      }
      s = steps->Run(spec, data.data(), data.data(), nullptr, MonotonicNow() + absl::Seconds(30), NotInterrupted);
      EXPECT_TRUE(s.ok()) << m << ": " << s;
      EXPECT_EQ(data[0], 3.0f);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(StageSteps, AGoneMemberFailsTheOthersAtOnceNamingItsRank) {
  Stage stage({10, 11, 12});
  std::thread broker([&] {
    absl::SleepFor(absl::Milliseconds(100));
    stage.header().gone[1].store(1);
    RingBell(stage.header().bell);
  });
  std::vector<std::thread> threads;
  for (uint32_t m : {0u, 2u}) {
    threads.emplace_back([&, m] {
      std::vector<float> data(16, 1.0f);
      const absl::Time start = MonotonicNow();
      absl::Status s = stage.Member(m)->Run(StepSpec{1, 0, 0, 16, 16}, data.data(), data.data(), nullptr,
                                            start + absl::Seconds(30), NotInterrupted);
      EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
      EXPECT_NE(s.message().find("worker rank 11"), std::string::npos) << s;
      EXPECT_LT(MonotonicNow() - start, absl::Seconds(5));
    });
  }
  for (auto& t : threads) t.join();
  broker.join();
}

TEST(StageSteps, AMemberThatNeverComesIsNamedAtTheDeadline) {
  Stage stage({10, 11, 12});
  std::vector<std::thread> threads;
  for (uint32_t m : {0u, 1u}) {
    threads.emplace_back([&, m] {
      std::vector<float> data(16, 1.0f);
      absl::Status s = stage.Member(m)->Run(StepSpec{1, 0, 0, 16, 16}, data.data(), data.data(), nullptr,
                                            MonotonicNow() + absl::Milliseconds(300), NotInterrupted);
      EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
      EXPECT_NE(s.message().find("ranks 12 of this host"), std::string::npos) << s;
    });
  }
  for (auto& t : threads) t.join();
}

TEST(HostHello, MessagesRoundTripAndBadOnesAreRefusedByName) {
  const HostHello hello{"job-a", 8, 3, 4};
  auto back = DecodeHostHello(EncodeHostHello(hello));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->job_name, "job-a");
  EXPECT_EQ(back->local_size, 4u);
  auto bad = DecodeHostHello(EncodeHostHello(HostHello{"job-a", 8, 8, 4}));
  EXPECT_NE(bad.status().message().find("rank 8 is not below world_size 8"), std::string::npos) << bad.status();
  bad = DecodeHostHello(EncodeHostHello(HostHello{"job-a", 8, 1, 1}));
  EXPECT_NE(bad.status().message().find("local_size 1"), std::string::npos) << bad.status();
  std::vector<uint8_t> cut = EncodeHostHello(hello);
  cut.pop_back();
  EXPECT_FALSE(DecodeHostHello(cut).ok());

  HostWelcome w;
  w.member = 1;
  w.ranks = {2, 5};
  w.slot_bytes = 1 << 20;
  auto wb = DecodeHostWelcome(EncodeHostWelcome(w));
  ASSERT_TRUE(wb.ok()) << wb.status();
  EXPECT_EQ(wb->ranks, w.ranks);
  w.ranks = {5, 2};
  EXPECT_FALSE(DecodeHostWelcome(EncodeHostWelcome(w)).ok());
  HostWelcome refusal;
  refusal.code = absl::StatusCode::kResourceExhausted;
  refusal.reason = "dlcpd --host-shm-bytes";
  auto rb = DecodeHostWelcome(EncodeHostWelcome(refusal));
  ASSERT_TRUE(rb.ok());
  EXPECT_EQ(rb->reason, refusal.reason);
}

}  // namespace
}  // namespace dlcp
