#include "common/base/clock.h"
#include "server/jobs/key_ring.h"

#include <gtest/gtest.h>

#include <vector>

#include "server/jobs/job_registry.h"

namespace dlcp::server {
namespace {

// A datagram of a 48-byte header and 16 bytes of payload, signed with `key`.
std::vector<uint8_t> Signed(const wire::MacKey& key) {
  std::vector<uint8_t> d(wire::kHeaderSize + 16 + wire::kMacSize, 7);
  wire::ComputeMac(key, d.data(), d.data() + wire::kHeaderSize, 16, d.data() + wire::kHeaderSize + 16);
  return d;
}

wire::MacKey Key(uint64_t seed) { return wire::MacKey{seed, seed + 1, seed + 2, seed + 3}; }

TEST(KeyRing, RotationAcceptsBothKeysUntilEveryMemberHoldsTheNewOneAndTheGraceHasPassed) {
  KeyRing ring(Key(10), 3, /*per_worker=*/false);
  const absl::Time t0 = MonotonicNow();
  const std::vector<bool> joined{true, true, false};  // rank 2 has not joined: it holds nothing
  const std::vector<uint8_t> old_packet = Signed(Key(10));
  EXPECT_EQ(ring.Current().generation, 1u);
  EXPECT_TRUE(ring.Current().Verify(old_packet, 16, 0));
  EXPECT_FALSE(ring.Advance(joined, t0, absl::Seconds(1)));  // nothing under way

  ASSERT_TRUE(*ring.Rotate(t0));
  const KeyRing::Keys& rolling = ring.Current();
  EXPECT_EQ(rolling.generation, 2u);
  EXPECT_FALSE(rolling.switched);
  EXPECT_EQ(*rolling.send(0), Key(10));  // members that have not heard of the new key check this
  EXPECT_TRUE(rolling.Verify(old_packet, 16, 0));
  EXPECT_TRUE(rolling.Verify(Signed(rolling.newest->secret), 16, 0));
  EXPECT_FALSE(rolling.Verify(Signed(Key(99)), 16, 0));
  EXPECT_FALSE(*ring.Rotate(t0));  // one rotation at a time

  ring.Holds(0, 2);
  EXPECT_FALSE(ring.Advance(joined, t0, absl::Seconds(1)));  // rank 1 still signs with key 1
  EXPECT_FALSE(ring.Current().switched);
  ring.Holds(1, 2);
  EXPECT_TRUE(ring.Advance(joined, t0 + absl::Milliseconds(5), absl::Seconds(1)));
  const KeyRing::Keys& switched = ring.Current();
  EXPECT_TRUE(switched.switched);
  EXPECT_EQ(*switched.send(0), switched.newest->secret);
  EXPECT_TRUE(switched.Verify(old_packet, 16, 0));  // pushes signed before the switch may be in flight

  EXPECT_FALSE(ring.Advance(joined, t0 + absl::Milliseconds(900), absl::Seconds(1)));
  EXPECT_TRUE(ring.Advance(joined, t0 + absl::Milliseconds(1005), absl::Seconds(1)));
  const KeyRing::Keys& settled = ring.Current();
  EXPECT_EQ(settled.previous, nullptr);
  EXPECT_FALSE(settled.Verify(old_packet, 16, 0));
  EXPECT_TRUE(settled.Verify(Signed(settled.newest->secret), 16, 0));
  // Snapshots a data thread may still hold stay as they were.
  EXPECT_TRUE(rolling.Verify(old_packet, 16, 0));
  EXPECT_EQ(rolling.generation, 2u);

  ASSERT_TRUE(*ring.Rotate(t0 + absl::Seconds(2)));
  EXPECT_EQ(ring.Current().generation, 3u);
  EXPECT_EQ(ring.Current().previous->secret, settled.newest->secret);
  EXPECT_NE(ring.Current().newest->secret, settled.newest->secret);
}

// Per-worker keys: each rank signs with a key derived for it alone and checks what it is sent with
// another, so a member that holds its own keys cannot sign as another rank, nor as the aggregator
// to another rank, not even during a rotation; the secret itself signs nothing.
TEST(KeyRing, EachRankSignsAndChecksWithKeysOfItsOwnThatNoOtherRankHolds) {
  KeyRing ring(Key(10), 3);
  const KeyRing::Keys& first = ring.Current();
  const KeyRing::Generation& g = *first.newest;
  ASSERT_EQ(g.workers.size(), 3u);
  ASSERT_EQ(g.results.size(), 3u);
  std::vector<wire::MacKey> seen{g.secret};
  for (uint32_t r = 0; r < 3; ++r) {
    ASSERT_NE(g.worker(r), nullptr);
    ASSERT_NE(g.result(r), nullptr);
    EXPECT_EQ(*g.worker(r), wire::DeriveMacKey(Key(10), wire::KeyPurpose::kWorker, r));
    EXPECT_EQ(*g.result(r), wire::DeriveMacKey(Key(10), wire::KeyPurpose::kResults, r));
    EXPECT_EQ(first.send(r), g.result(r));
    for (const wire::MacKey* key : {g.worker(r), g.result(r)}) {
      for (const wire::MacKey& k : seen) EXPECT_NE(*key, k) << "rank " << r;
      seen.push_back(*key);
    }
  }
  EXPECT_EQ(g.worker(3), nullptr);
  EXPECT_EQ(g.result(3), nullptr);
  EXPECT_EQ(first.send(3), nullptr);

  const std::vector<uint8_t> from_1 = Signed(*g.worker(1));
  EXPECT_TRUE(first.Verify(from_1, 16, 1));
  EXPECT_FALSE(first.Verify(from_1, 16, 0));  // rank 1's key does not sign for rank 0
  EXPECT_FALSE(first.Verify(from_1, 16, 3));  // nor for a rank the job does not have
  EXPECT_FALSE(first.Verify(Signed(*g.result(1)), 16, 1));
  EXPECT_FALSE(first.Verify(Signed(g.secret), 16, 1));

  // While a rotation rolls out, each rank's key of either generation signs for that rank only.
  ASSERT_TRUE(*ring.Rotate(MonotonicNow()));
  const KeyRing::Keys& rolling = ring.Current();
  EXPECT_NE(*rolling.newest->worker(1), *g.worker(1));
  EXPECT_TRUE(rolling.Verify(from_1, 16, 1));
  EXPECT_TRUE(rolling.Verify(Signed(*rolling.newest->worker(1)), 16, 1));
  EXPECT_FALSE(rolling.Verify(Signed(*rolling.newest->worker(1)), 16, 2));
  EXPECT_FALSE(rolling.Verify(Signed(*g.worker(2)), 16, 1));
  EXPECT_EQ(rolling.send(1), g.result(1));  // until every member holds the new one
  EXPECT_NE(*rolling.newest->result(1), *g.result(1));

  // Without per-worker keys every member signs with the secret, as clients from before expect.
  KeyRing shared(Key(10), 3, /*per_worker=*/false);
  EXPECT_TRUE(shared.Current().newest->workers.empty());
  EXPECT_EQ(*shared.Current().newest->worker(2), Key(10));
  EXPECT_EQ(*shared.Current().send(2), Key(10));
  EXPECT_TRUE(shared.Current().Verify(Signed(Key(10)), 16, 2));
}

TEST(KeyRing, AJoinedRankThatNeverHoldsTheNewKeyKeepsTheOldOneSigning) {
  KeyRing ring(Key(10), 2, /*per_worker=*/false);
  const absl::Time t0 = MonotonicNow();
  ASSERT_TRUE(*ring.Rotate(t0));
  ring.Holds(0, 2);
  ring.Holds(1, 1);  // a heartbeat from before the rotation
  for (int i = 1; i <= 10; ++i) EXPECT_FALSE(ring.Advance({true, true}, t0 + absl::Seconds(i), absl::Seconds(1)));
  EXPECT_EQ(*ring.Current().send(1), Key(10));
  EXPECT_TRUE(ring.Current().previous != nullptr);
  // Once it leaves, the members left decide.
  EXPECT_TRUE(ring.Advance({true, false}, t0 + absl::Seconds(11), absl::Seconds(1)));
  EXPECT_TRUE(ring.Current().switched);
}

TEST(KeyRing, RegistryRotatesOnScheduleAndCountsOnlyGenerationsItHandedOut) {
  JobLimits limits;
  limits.data_key_rotation = absl::Seconds(60);
  limits.data_key_grace = absl::Milliseconds(100);
  JobRegistry jobs(limits);
  JoinSpec spec{"rotating", 2, 0, 1024, Address{0x7f000001, 5000}};
  ASSERT_TRUE(jobs.Join(spec).ok());
  spec.rank = 1;
  spec.data_address = Address{0x7f000001, 5001};
  absl::StatusOr<std::shared_ptr<Job>> job = jobs.Join(spec);
  ASSERT_TRUE(job.ok());
  const uint32_t id = (*job)->id;
  const absl::Time t0 = MonotonicNow();
  EXPECT_TRUE(jobs.TendKeys(t0).empty());  // not due
  EXPECT_EQ(jobs.TendKeys(t0 + absl::Seconds(61)).size(), 1u);  // drawn
  EXPECT_EQ((*job)->keys()->generation, 2u);
  // A member claiming a generation never handed out does not switch the job to it for the others.
  ASSERT_TRUE(jobs.Heartbeat(id, 0, 7).ok());
  ASSERT_TRUE(jobs.Heartbeat(id, 1, 1).ok());
  EXPECT_FALSE((*job)->keys()->switched);
  ASSERT_TRUE(jobs.Heartbeat(id, 1, 2).ok());
  EXPECT_TRUE((*job)->keys()->switched);
  absl::SleepFor(absl::Milliseconds(150));
  EXPECT_EQ(jobs.TendKeys(MonotonicNow()).size(), 1u);  // settled
  EXPECT_FALSE((*job)->keys()->previous != nullptr);
  EXPECT_TRUE(*jobs.RotateKey(id, MonotonicNow()));
  EXPECT_FALSE(*jobs.RotateKey(id, MonotonicNow()));
  EXPECT_EQ(jobs.RotateKey(id + 1, MonotonicNow()).status().code(), absl::StatusCode::kNotFound);

  JobLimits open;
  open.data_auth = false;
  JobRegistry plain(open);
  spec.rank = 0;
  absl::StatusOr<std::shared_ptr<Job>> unsigned_job = plain.Join(spec);
  ASSERT_TRUE(unsigned_job.ok());
  EXPECT_EQ((*unsigned_job)->keys(), nullptr);
  EXPECT_EQ(plain.RotateKey((*unsigned_job)->id, MonotonicNow()).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace dlcp::server
