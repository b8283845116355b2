// A host stage's steps (client/host/stage_steps.h) between threads, each a member with its own
// mapping of one region, as processes have: exact sums over many steps, the first member's network
// leg, broadcasts bit for bit, and members that disagree, vanish or never come named. Then whole
// host stages (client/host/host_stage.h) over such a region, with a network of their own.
#include "client/host/stage_steps.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <atomic>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "client/host/host_stage.h"
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
  // Runs body(m, member m's steps) for each of `members` on a thread of its own, and joins them.
  void Each(const std::vector<uint32_t>& members, const std::function<void(uint32_t, StageSteps&)>& body) {
    std::vector<std::thread> threads;
    for (uint32_t m : members) {
      threads.emplace_back([&, m] { body(m, *Member(m)); });
    }
    for (auto& t : threads) t.join();
  }
  StageHeader& header() { return *static_cast<StageHeader*>(region->data()); }
  StageMembership Membership(uint32_t i) {
    auto mapped = SharedRegion::Map(::dup(region->fd()), StageRegionBytes(members(), kSlotBytes));
    EXPECT_TRUE(mapped.ok()) << mapped.status();
    HostWelcome w;
    w.member = i;
    w.ranks = ranks;
    w.slot_bytes = kSlotBytes;
    return StageMembership{std::move(*mapped), w, OwnedFd()};
  }
  std::unique_ptr<StageSteps> Member(uint32_t i) { return std::make_unique<StageSteps>(Membership(i)); }
  std::vector<uint32_t> ranks;
  std::optional<SharedRegion> region;
};

absl::Status NotInterrupted() { return absl::OkStatus(); }

// A network leg's time on the wire: until `company` legs run at once, 50 ms at most, so that legs
// that can overlap do, however slowly (under a sanitizer, say) the members begin the next steps.
void OnTheWire(const std::atomic<int>& running, int company) {
  for (const absl::Time end = MonotonicNow() + absl::Milliseconds(50); running.load() < company && MonotonicNow() < end;) {
    absl::SleepFor(absl::Milliseconds(1));
  }
}

// One step of `data` (spec.elems values, summed in place) that may take up to `timeout`.
absl::Status RunStep(StageSteps& steps, const StepSpec& spec, std::vector<float>& data,
                     absl::Duration timeout = absl::Seconds(30), const NetworkLeg& leg = nullptr) {
  return steps.Run(spec, data.data(), data.data(), leg, MonotonicNow() + timeout, NotInterrupted);
}

TEST(StageSteps, MembersSumExactlyOverManyStepsWithTheFirstOnesNetworkLeg) {
  Stage stage({4, 5, 9});
  const uint64_t slot_elems = kSlotBytes / 4;
  std::vector<int> failures(3, 0);
  // The other hosts' part, as the aggregators would add it.
  const NetworkLeg leg = [](float* sum, const StepSpec& s, uint64_t, const LegDone& done) {
    for (uint64_t i = 0; i < s.elems; ++i) sum[i] += 1000.0f;
    done(absl::OkStatus());
  };
  stage.Each({0, 1, 2}, [&](uint32_t m, StageSteps& steps) {
    for (uint32_t step = 0; step < 300; ++step) {
      const uint64_t elems = 1 + (step * 7919) % slot_elems;
      std::vector<float> data(elems);
      for (uint64_t i = 0; i < elems; ++i) data[i] = static_cast<float>((m + 1) * (i % 97) + step);
      absl::Status s = RunStep(steps, StepSpec{step % 5, 0, 0, elems, elems}, data, absl::Seconds(30),
                               m == 0 ? leg : nullptr);
      if (!s.ok()) ADD_FAILURE() << "member " << m << " step " << step << ": " << s;
      for (uint64_t i = 0; i < elems; ++i) {
        const float want = static_cast<float>(6 * (i % 97) + 3 * step) + 1000.0f;
        if (data[i] != want && failures[m]++ < 3) ADD_FAILURE() << "member " << m << " step " << step << " [" << i << "]";
      }
    }
  });
}

// A leg that ends later, on a thread of its own, as the engine's does: the members begin up to
// kStageBanks steps before they end the first of them, so legs of different keys run side by
// side, more than two at once, and a key's next leg waits for its last one (the engine runs one op
// of a key at a time). Sums stay exact.
TEST(StageSteps, StepsOverlapTheNetworkLegsBeforeThemAndAKeysLegsDoNot) {
  Stage stage({0, 1, 2});
  constexpr uint32_t kSteps = 120;
  constexpr uint32_t kKeys = 12;
  std::mutex mu;
  std::vector<std::thread> legs;
  std::atomic<int> running{0}, most_running{0};
  std::atomic<int> running_of_key[kKeys] = {};
  std::atomic<int> same_key_overlaps{0};
  const NetworkLeg leg = [&](float* sum, const StepSpec& s, uint64_t, LegDone done) {
    std::lock_guard<std::mutex> lock(mu);
    legs.emplace_back([&, sum, s, done = std::move(done)] {
      if (running_of_key[s.key].fetch_add(1) > 0) same_key_overlaps.fetch_add(1);
      const int now = running.fetch_add(1) + 1;
      for (int seen = most_running.load(); now > seen && !most_running.compare_exchange_weak(seen, now);) {
      }
      OnTheWire(running, 3);
      for (uint64_t i = 0; i < s.elems; ++i) sum[i] += 1000.0f;
      running.fetch_sub(1);
      running_of_key[s.key].fetch_sub(1);
      done(absl::OkStatus());
    });
  };
  std::atomic<int> wrong{0};
  stage.Each({0, 1, 2}, [&](uint32_t m, StageSteps& steps) {
    const absl::Time deadline = MonotonicNow() + absl::Seconds(60);
    std::vector<std::vector<float>> data(kSteps);
    std::deque<std::pair<BegunStep, StepIo>> pending;  // oldest first
    auto end = [&] {
      const uint32_t step = static_cast<uint32_t>(pending.front().first.step - 1);
      absl::Status s = steps.End(pending.front().first, pending.front().second.out, deadline, NotInterrupted);
      pending.pop_front();
      EXPECT_TRUE(s.ok()) << "member " << m << " step " << step << ": " << s;
      for (uint64_t i = 0; i < data[step].size(); ++i) {
        if (data[step][i] != static_cast<float>(6 * (i % 97) + 3 * step) + 1000.0f) wrong.fetch_add(1);
      }
    };
    for (uint32_t step = 0; step < kSteps; ++step) {
      const uint64_t elems = 1 + (step * 7919) % (kSlotBytes / 4);
      data[step].resize(elems);
      for (uint64_t i = 0; i < elems; ++i) data[step][i] = static_cast<float>((m + 1) * (i % 97) + step);
      StepIo io = HostStepIo(data[step].data(), data[step].data(), elems);
      // Another key each step, but every tenth step, whose key is the step's before.
      const uint32_t key = (step % 10 == 9 ? step - 1 : step) % kKeys;
      BegunStep begun = steps.Begin(StepSpec{key, 0, 0, elems, elems}, io, m == 0 ? leg : nullptr, deadline,
                                    NotInterrupted);
      EXPECT_TRUE(begun.status.ok()) << "member " << m << " step " << step << ": " << begun.status;
      pending.emplace_back(begun, std::move(io));
      if (pending.size() == kStageBanks) end();  // Begin waits for the bank's last step to end
    }
    while (!pending.empty()) end();
  });
  for (std::thread& t : legs) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(same_key_overlaps.load(), 0);
  EXPECT_GT(most_running.load(), 2) << "no more than two legs ever ran side by side";
  EXPECT_LE(most_running.load(), static_cast<int>(kStageBanks));
}

TEST(StageSteps, ABroadcastCarriesTheRootsBitsExactly) {
  Stage stage({0, 1});
  const std::vector<float> root_values = {-0.0f, std::nanf("0x123"), 1e-45f, -3.5f};
  std::vector<std::vector<float>> out(2, std::vector<float>(4, 7.0f));
  out[1] = root_values;
  stage.Each({0, 1}, [&](uint32_t m, StageSteps& steps) {
    absl::Status s = RunStep(steps, StepSpec{3, 1 + 1 /* from rank 1 */, 0, 4, 4}, out[m]);
    EXPECT_TRUE(s.ok()) << s;
  });
  for (uint32_t m = 0; m < 2; ++m) EXPECT_EQ(std::memcmp(out[m].data(), root_values.data(), 16), 0) << m;
}

TEST(StageSteps, MembersThatRunDifferentOpsAllFailNamingThemAndTheNextStepWorks) {
  Stage stage({0, 1, 2});
  stage.Each({0, 1, 2}, [&](uint32_t m, StageSteps& steps) {
    std::vector<float> data(16, 1.0f);
    absl::Status s = RunStep(steps, StepSpec{m == 2 ? 9u : 7u, 0, 0, 16, 16}, data);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << m << ": " << s;
    EXPECT_NE(s.message().find("key 9"), std::string::npos) << s;
    s = RunStep(steps, StepSpec{8, 0, 0, 16, 16}, data);
    EXPECT_TRUE(s.ok()) << m << ": " << s;
    EXPECT_EQ(data[15], 3.0f);
  });
}

// Members that run an op under different loss bounds cannot share its manifest: every member
// fails naming both, and the next step works.
TEST(StageSteps, MembersThatDisagreeOnTheLossBoundAllFailNamingIt) {
  Stage stage({0, 1});
  stage.Each({0, 1}, [&](uint32_t m, StageSteps& steps) {
    std::vector<float> data(16, 1.0f);
    absl::Status s = RunStep(steps, StepSpec{7, 0, 0, 16, 16, m == 1 ? 50000u : 10000u}, data);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << m << ": " << s;
    EXPECT_NE(s.message().find("loss bound 0.05"), std::string::npos) << s;
    EXPECT_NE(s.message().find("loss bound 0.01"), std::string::npos) << s;
    s = RunStep(steps, StepSpec{7, 0, 0, 16, 16, 10000}, data);
    EXPECT_TRUE(s.ok()) << m << ": " << s;
    EXPECT_EQ(data[0], 2.0f);
  });
}

// A member whose op already failed gives the step up at once (Skip): the others fail that step
// too, giving its reason (StageNotice), and every member is in step for the next.
TEST(StageSteps, AStepOneMemberGivesUpFailsForAllAndTheNextOneWorks) {
  Stage stage({3, 4, 5});
  stage.Each({0, 1, 2}, [&](uint32_t m, StageSteps& steps) {
    std::vector<float> data(16, 1.0f);
    const StepSpec spec{4, 0, 0, 16, 16};
    absl::Status s = m == 1 ? steps.Skip(spec, absl::AbortedError("its job failed"), MonotonicNow() + absl::Seconds(30),
                                         NotInterrupted)
                            : RunStep(steps, spec, data);
    EXPECT_FALSE(s.ok()) << m;
    if (m != 1) {
      EXPECT_EQ(s, absl::AbortedError("its job failed")) << m;
    }
    s = RunStep(steps, spec, data);
    EXPECT_TRUE(s.ok()) << m << ": " << s;
    EXPECT_EQ(data[0], 3.0f);
  });
}

// A member whose copy into its slot fails (a device tensor it could not read) fails the step for
// every member with its reason; one whose copy out fails fails alone, the others having their
// result. Both go on in step.
TEST(StageSteps, AFailedCopyInFailsTheStepForAllAndACopyOutOnlyItsMember) {
  Stage stage({6, 7});
  stage.Each({0, 1}, [&](uint32_t m, StageSteps& steps) {
    std::vector<float> data(16, 1.0f);
    const StepSpec spec{5, 0, 0, 16, 16};
    StepIo io = HostStepIo(data.data(), data.data(), 16);
    if (m == 1) io.in = [](float*) { return absl::InternalError("reading key 5's device tensor: CUDA error 700"); };
    absl::Status s = steps.Run(spec, io, nullptr, MonotonicNow() + absl::Seconds(30), NotInterrupted);
    EXPECT_EQ(s, absl::InternalError("reading key 5's device tensor: CUDA error 700")) << m;

    io = HostStepIo(data.data(), data.data(), 16);
    if (m == 0) io.out = [](const float*) { return absl::InternalError("writing key 5's result: CUDA error 700"); };
    s = steps.Run(spec, io, nullptr, MonotonicNow() + absl::Seconds(30), NotInterrupted);
    EXPECT_EQ(s.ok(), m == 1) << m << ": " << s;
    if (m == 1) {
      EXPECT_EQ(data[0], 2.0f);
    }

    data.assign(16, 1.0f);
    s = RunStep(steps, spec, data);
    EXPECT_TRUE(s.ok()) << m << ": " << s;
    EXPECT_EQ(data[15], 2.0f);
  });
}

// Writes member `i`'s record of step 1 of an all-reduce of key 4 (16 elements) as a worker writes
// it, and publishes it as arrived and summed: a third member played by the test.
void PlayMember(Stage& stage, uint32_t i, uint64_t step) {
  StageMember& m = stage.header().member[i];
  m.step = step;
  m.key = 4;
  m.kind = 0;
  m.offset = 0;
  m.elems = 16;
  m.tensor_elems = 16;
  m.loss_bound_ppm = 0;
  m.arrived.store(1);
  m.summed.store(1);
  RingBell(stage.header().bell);
}

// Something other than a member writes into the region: a record at another step that no member
// marked given up. The members fail the step as damage, and blame no rank for giving up.
TEST(StageSteps, ARecordNoMemberWroteIsDamageNotARankThatGaveUp) {
  Stage stage({20, 21, 22});
  std::thread damage([&] { PlayMember(stage, 2, 12345); });
  stage.Each({0, 1}, [&](uint32_t m, StageSteps& steps) {
    std::vector<float> data(16, 1.0f);
    absl::Status s = RunStep(steps, StepSpec{4, 0, 0, 16, 16}, data, absl::Seconds(10));
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << m << ": " << s;
    EXPECT_NE(s.message().find("says rank 22 came to step 12345"), std::string::npos) << s;
    EXPECT_EQ(s.message().find("gave up"), std::string::npos) << s;
  });
  damage.join();
}

// A worker's own record changed under it: it says so, rather than compare a rank with itself.
TEST(StageSteps, AWorkersOwnRecordChangedUnderItIsDamageNamedAsSuch) {
  Stage stage({30, 31, 32});
  std::thread damage([&] {
    // Both real members have written their records and wait for the third.
    for (const absl::Time end = MonotonicNow() + absl::Seconds(10);
         (stage.header().member[0].arrived.load() < 1 || stage.header().member[1].arrived.load() < 1) &&
         MonotonicNow() < end;) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    stage.header().member[0].key = 999;
    PlayMember(stage, 2, 1);
  });
  stage.Each({0, 1}, [&](uint32_t m, StageSteps& steps) {
    std::vector<float> data(16, 1.0f);
    absl::Status s = RunStep(steps, StepSpec{4, 0, 0, 16, 16}, data, absl::Seconds(10));
    EXPECT_FALSE(s.ok()) << m;
    if (m == 0) {
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
      EXPECT_NE(s.message().find("record of rank 30's op says an all-reduce of key 999"), std::string::npos) << s;
      EXPECT_NE(s.message().find("where this worker wrote an all-reduce of key 4"), std::string::npos) << s;
    } else {  // what it sees: rank 30 runs another op
      EXPECT_NE(s.message().find("rank 30 runs an all-reduce of key 999"), std::string::npos) << s;
    }
    EXPECT_EQ(s.message().find("rank 30 runs an all-reduce of key 999 where rank 30"), std::string::npos) << s;
  });
  damage.join();
}

TEST(StageSteps, AGoneMemberFailsTheOthersAtOnceNamingItsRank) {
  Stage stage({10, 11, 12});
  std::thread broker([&] {
    absl::SleepFor(absl::Milliseconds(100));
    stage.header().gone[1].store(1);
    RingBell(stage.header().bell);
    RingBell(stage.header().result_bell);
  });
  stage.Each({0, 2}, [&](uint32_t m, StageSteps& steps) {
    std::vector<float> data(16, 1.0f);
    const absl::Time start = MonotonicNow();
    absl::Status s = RunStep(steps, StepSpec{1, 0, 0, 16, 16}, data);
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
    EXPECT_NE(s.message().find("worker rank 11"), std::string::npos) << s;
    EXPECT_LT(MonotonicNow() - start, absl::Seconds(5));
  });
  broker.join();
}

TEST(StageSteps, AMemberThatNeverComesIsNamedAtTheDeadline) {
  Stage stage({10, 11, 12});
  stage.Each({0, 1}, [&](uint32_t m, StageSteps& steps) {
    std::vector<float> data(16, 1.0f);
    absl::Status s = RunStep(steps, StepSpec{1, 0, 0, 16, 16}, data, absl::Milliseconds(300));
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_NE(s.message().find("ranks 12 of this host"), std::string::npos) << s;
  });
}

TEST(HostHello, MessagesRoundTripAndBadOnesAreRefusedByName) {
  const HostHello hello{"job-a", 8, 3, 4};
  auto back = DecodeHostHello(EncodeHostHello(hello));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->job_name, "job-a");
  EXPECT_EQ(back->local_size, 4u);
  EXPECT_FALSE(back->standby);
  HostHello standby = hello;
  standby.standby = true;
  back = DecodeHostHello(EncodeHostHello(standby));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->standby);
  std::vector<uint8_t> flagged = EncodeHostHello(hello);
  flagged[20] = 2;  // the flags word, after magic, version, world, rank and local_size
  EXPECT_NE(DecodeHostHello(flagged).status().message().find("hello flags 2 unknown"), std::string::npos);
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

namespace dlcp {
namespace {

// The aggregators, as the first worker's engine reaches them: each round ends later, on a thread
// of its own, once its gate (an op larger than a slot) has opened all the way, having added the
// other host's two workers' ones. Counts the rounds that run at once.
class FakeNetwork {
 public:
  ~FakeNetwork() {
    std::lock_guard<std::mutex> lock(mu_);
    for (std::thread& t : rounds_) t.join();
  }
  HostStage::NetworkSubmit Submit() {
    return [this](uint32_t, absl::Span<float> sum, const AllReduceOptions&, int64_t, std::shared_ptr<LegGate> gate,
                  OpDone done) {
      std::lock_guard<std::mutex> lock(mu_);
      rounds_.emplace_back([this, sum, gate = std::move(gate), done = std::move(done)] {
        const int now = running_.fetch_add(1) + 1;
        for (int seen = most_.load(); now > seen && !most_.compare_exchange_weak(seen, now);) {
        }
        // The engine pushes each part once its gate passed it; here the round just waits for all.
        for (const absl::Time end = MonotonicNow() + absl::Seconds(30);
             gate != nullptr && !gate->complete() && gate->abandoned().ok() && MonotonicNow() < end;) {
          absl::SleepFor(absl::Milliseconds(1));
        }
        OnTheWire(running_, 3);
        for (float& v : sum) v += 2.0f;
        running_.fetch_sub(1);
        done(RoundStats{});
      });
    };
  }
  int most_at_once() const { return most_.load(); }

 private:
  std::mutex mu_;
  std::vector<std::thread> rounds_;
  std::atomic<int> running_{0}, most_{0};
};

// Two workers of a job of four (the other host's two are the fake network's): each submits twelve
// ops at once, as a pipelined optimizer submits its buckets, three times over; some are larger
// than a slot. More than two network rounds run at once, and every sum is exact.
TEST(HostStagePipeline, ManyOpsOfDifferentKeysHaveMoreThanTwoRoundsInFlightAndSumExactly) {
  Stage stage({0, 1});
  FakeNetwork network;
  HostStage::Limits limits;
  limits.world = 4;
  limits.op_timeout = absl::Seconds(60);
  std::vector<std::unique_ptr<HostStage>> members;
  for (uint32_t m = 0; m < 2; ++m) {
    members.push_back(std::make_unique<HostStage>(stage.Membership(m), network.Submit(),
                                                  [](uint32_t, uint32_t) {}, limits, [](const absl::Status&) {}));
  }
  constexpr uint32_t kKeys = 12;
  const uint64_t slot_elems = kSlotBytes / 4;
  std::atomic<int> wrong{0};
  std::vector<std::thread> workers;
  for (uint32_t m = 0; m < 2; ++m) {
    workers.emplace_back([&, m] {
      for (int iteration = 0; iteration < 3; ++iteration) {
        std::vector<std::vector<float>> data(kKeys);
        std::vector<std::future<absl::StatusOr<RoundStats>>> done;
        for (uint32_t key = 0; key < kKeys; ++key) {
          data[key].assign(key % 4 == 3 ? 2 * slot_elems + 100 : 1000 + key, 1.0f);  // a quarter in three steps
          auto promise = std::make_shared<std::promise<absl::StatusOr<RoundStats>>>();
          done.push_back(promise->get_future());
          members[m]->Submit(key, absl::MakeSpan(data[key]), AllReduceOptions{}, -1,
                             [promise](absl::StatusOr<RoundStats> r) { promise->set_value(std::move(r)); });
        }
        for (uint32_t key = 0; key < kKeys; ++key) {
          ASSERT_EQ(done[key].wait_for(std::chrono::seconds(60)), std::future_status::ready) << m << " key " << key;
          absl::StatusOr<RoundStats> r = done[key].get();
          EXPECT_TRUE(r.ok()) << m << " key " << key << ": " << r.status();
          for (float v : data[key]) {
            if (v != 4.0f) wrong.fetch_add(1);
          }
        }
      }
    });
  }
  for (std::thread& t : workers) t.join();
  members.clear();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_GT(network.most_at_once(), 2) << "the stage never had more than two network rounds in flight";
}

}  // namespace
}  // namespace dlcp
