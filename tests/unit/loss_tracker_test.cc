// The bounded-loss state machine at one aggregator endpoint: manifests, counts, the bound and the
// repair plan; and the wire codecs of its two messages.
#include <gtest/gtest.h>

#include "common/wire/bounded.h"
#include "server/rounds/loss_tracker.h"

namespace dlcp::server {
namespace {

wire::ManifestPart Part(uint32_t ppm, uint32_t total, uint32_t first, std::vector<uint8_t> classes) {
  return wire::ManifestPart{ppm, total, first, std::move(classes)};
}

TEST(LossTracker, CountsClassZeroAndDroppableAndMeetsTheBound) {
  LossTracker t(2, 10);
  EXPECT_FALSE(t.manifests_complete());
  // Worker 0 owns chunks 0..9: chunk 0 class 0, the rest droppable. Worker 1 the same.
  std::vector<uint8_t> cls = {0, 1, 1, 2, 2, 3, 3, 3, 1, 2};
  for (uint32_t c = 0; c < 10; ++c) t.OnContribution(0, c);  // pushes before the manifest
  ASSERT_TRUE(t.AddManifest(0, Part(100000, 10, 0, cls)).ok());  // ε = 0.1
  EXPECT_FALSE(t.manifests_complete());
  ASSERT_TRUE(t.AddManifest(1, Part(200000, 10, 0, cls)).ok());  // the stricter ε wins
  EXPECT_EQ(t.loss_bound_ppm(), 100000u);
  EXPECT_EQ(t.droppable_total(), 18u);
  EXPECT_EQ(t.droppable_missing(), 9u);
  EXPECT_EQ(t.class0_missing(), 1u);
  EXPECT_EQ(t.allowed_missing(), 1u);  // floor(0.1 * 18)
  for (uint32_t c = 1; c < 9; ++c) t.OnContribution(1, c);
  EXPECT_FALSE(t.BoundMet()) << "class 0 of worker 1 is still missing";
  t.OnContribution(1, 0);
  EXPECT_TRUE(t.BoundMet());
  EXPECT_FALSE(t.AllIn());
  t.OnContribution(1, 9);
  t.OnContribution(1, 9);  // a duplicate changes nothing
  EXPECT_TRUE(t.AllIn());
  EXPECT_EQ(t.droppable_missing(), 0u);
}

TEST(LossTracker, ManifestPartsAssembleAndContradictionsAreRefused) {
  LossTracker t(1, 8);
  const uint8_t X = wire::kNotHere;
  ASSERT_TRUE(t.AddManifest(0, Part(0, 4, 0, {1, X, 1, X})).ok());
  EXPECT_FALSE(t.has_manifest(0));
  ASSERT_TRUE(t.AddManifest(0, Part(0, 4, 0, {1, X, 1, X})).ok());  // a repeat is harmless
  EXPECT_FALSE(t.AddManifest(0, Part(0, 5, 4, {0, 0})).ok()) << "another total";
  EXPECT_FALSE(t.AddManifest(0, Part(0, 4, 2, {2})).ok()) << "another class for chunk 2";
  EXPECT_FALSE(t.AddManifest(0, Part(0, 4, 4, {1, 1, 1})).ok()) << "more chunks than the total";
  ASSERT_TRUE(t.AddManifest(0, Part(0, 4, 5, {0, X, 3})).ok());
  EXPECT_TRUE(t.has_manifest(0));
  EXPECT_TRUE(t.owned(7));
  EXPECT_FALSE(t.owned(1));
  EXPECT_EQ(t.class_of(0, 5), 0);
  EXPECT_EQ(t.class_of(0, 6), wire::kNotHere);
  EXPECT_EQ(t.droppable_total(), 3u);
  EXPECT_EQ(t.class0_missing(), 1u);
  // ε = 0 (ppm 0): nothing droppable may be missing.
  EXPECT_EQ(t.allowed_missing(), 0u);
}

TEST(LossTracker, RepairAsksForEveryClassZeroAndOnlyWhatTheBoundNeeds) {
  constexpr uint32_t kWorkers = 4, kChunks = 100;
  LossTracker t(kWorkers, kChunks);
  std::vector<uint8_t> cls(kChunks);
  for (uint32_t c = 0; c < kChunks; ++c) cls[c] = c < 10 ? 0 : 1 + c % 3;
  for (uint32_t w = 0; w < kWorkers; ++w) ASSERT_TRUE(t.AddManifest(w, Part(50000, kChunks, 0, cls)).ok());  // 5%
  // Every worker lost chunks 0..1 (class 0) and 50..79 (droppable): 120 of 360 droppable missing.
  for (uint32_t w = 0; w < kWorkers; ++w) {
    for (uint32_t c = 0; c < kChunks; ++c) {
      if (c >= 2 && (c < 50 || c >= 80)) t.OnContribution(w, c);
    }
  }
  EXPECT_EQ(t.allowed_missing(), 18u);
  auto plan = t.RepairPlan(/*rotate=*/1);
  size_t by_class[4] = {};
  for (uint32_t w = 0; w < kWorkers; ++w) {
    ASSERT_GE(plan[w].size(), 2u);
    EXPECT_EQ(plan[w][0], 0u);
    EXPECT_EQ(plan[w][1], 1u);
    for (uint32_t c : plan[w]) ++by_class[cls[c]];
  }
  EXPECT_EQ(by_class[0], 2u * kWorkers) << "every missing class-0 chunk";
  // 102 droppable to fetch (120 missing, 18 allowed): all 40 of class 1, all 40 of class 2, and
  // 22 of the 40 class-3 ones.
  EXPECT_EQ(by_class[1], 40u);
  EXPECT_EQ(by_class[2], 40u);
  EXPECT_EQ(by_class[3], 22u);
}

TEST(LossTracker, RepairsPreferImportantClassesAndRotateTheWorkersCut) {
  constexpr uint32_t kWorkers = 3, kChunks = 30;
  std::vector<uint8_t> cls(kChunks);
  for (uint32_t c = 0; c < kChunks; ++c) cls[c] = 1 + c % 3;  // nothing class 0
  std::vector<uint32_t> cut(kWorkers);
  for (uint32_t round = 0; round < 30; ++round) {
    LossTracker t(kWorkers, kChunks);
    for (uint32_t w = 0; w < kWorkers; ++w) ASSERT_TRUE(t.AddManifest(w, Part(100000, kChunks, 0, cls)).ok());
    // Each worker lost its class-3 chunks 2, 5 and 8 and the class-1 chunk 9: 12 of 90 missing.
    for (uint32_t w = 0; w < kWorkers; ++w) {
      for (uint32_t c = 0; c < kChunks; ++c) {
        if (c != 2 && c != 5 && c != 8 && c != 9) t.OnContribution(w, c);
      }
    }
    ASSERT_EQ(t.allowed_missing(), 9u);
    auto plan = t.RepairPlan(round);
    // 3 to fetch: the class-1 chunk 9 of every worker, before any class-3 chunk.
    for (uint32_t w = 0; w < kWorkers; ++w) EXPECT_EQ(plan[w], std::vector<uint32_t>{9}) << "round " << round;
    // Lose more class-3 chunks (one worker, chosen by the round, loses one extra): 7 must now be
    // fetched, the three class-1 chunks first, then class-3 ones spread over the workers
    // starting with the round's rotation.
    LossTracker u(kWorkers, kChunks);
    for (uint32_t w = 0; w < kWorkers; ++w) ASSERT_TRUE(u.AddManifest(w, Part(100000, kChunks, 0, cls)).ok());
    for (uint32_t w = 0; w < kWorkers; ++w) {
      for (uint32_t c = 0; c < kChunks; ++c) {
        if (c != 2 && c != 5 && c != 8 && c != 11 && c != 9 && !(w == round % kWorkers && c == 14)) {
          u.OnContribution(w, c);
        }
      }
    }
    auto plan2 = u.RepairPlan(round);
    size_t fetched = 0;
    for (uint32_t w = 0; w < kWorkers; ++w) fetched += plan2[w].size();
    EXPECT_EQ(fetched, u.droppable_missing() - u.allowed_missing());
    for (uint32_t w = 0; w < kWorkers; ++w) cut[w] += 5 + (w == round % kWorkers) - plan2[w].size();
  }
  // Over 30 rounds every worker was cut about equally often.
  const auto [lo, hi] = std::minmax_element(cut.begin(), cut.end());
  EXPECT_LE(*hi - *lo, 12u) << cut[0] << " " << cut[1] << " " << cut[2];
}

TEST(LossTracker, ChunksNotPushedYetAreNotAskedFor) {
  LossTracker t(2, 10);
  std::vector<uint8_t> cls(10, 1);
  cls[8] = 0;
  for (uint32_t w = 0; w < 2; ++w) ASSERT_TRUE(t.AddManifest(w, Part(0, 10, 0, cls)).ok());  // ε = 0
  // Worker 0 has pushed chunks 0..5 and lost 2; worker 1 all but 9.
  for (uint32_t c = 0; c < 6; ++c) {
    if (c != 2) t.OnContribution(0, c);
  }
  for (uint32_t c = 0; c < 9; ++c) t.OnContribution(1, c);
  auto plan = t.RepairPlan(0);
  EXPECT_EQ(plan[0], std::vector<uint32_t>{2}) << "6..9 are still on their way";
  EXPECT_TRUE(plan[1].empty()) << "9 may not have been pushed yet";
  // Their result requests say they have pushed everything: now the tail is lost, not late.
  t.MarkSentThrough(0, 9);
  t.MarkSentThrough(1, 9);
  plan = t.RepairPlan(0);
  EXPECT_EQ(plan[0], (std::vector<uint32_t>{2, 6, 7, 8, 9}));
  EXPECT_EQ(plan[1], std::vector<uint32_t>{9});
}

TEST(LossTracker, StrictPriorityReorderingIsNotLoss) {
  // Chunks 0..5 alternate class 1 and 3. The switch serves class 1 first, so class-3 chunks
  // arrive late: chunk 1 (class 3) missing behind chunk 4 (class 1) is not lost yet.
  LossTracker t(1, 6);
  ASSERT_TRUE(t.AddManifest(0, Part(0, 6, 0, {1, 3, 1, 3, 1, 3})).ok());
  t.OnContribution(0, 0);
  t.OnContribution(0, 4);
  EXPECT_EQ(t.RepairPlan(0)[0], std::vector<uint32_t>{2}) << "class 1: 2 is lost, 4 came after it";
  t.OnContribution(0, 3);
  EXPECT_EQ(t.RepairPlan(0)[0], (std::vector<uint32_t>{1, 2})) << "class 3: 1 is lost, 3 came after it";
}

TEST(BoundedWire, ManifestRoundTripsAndSplits) {
  std::vector<uint8_t> cls(5000, wire::kNotHere);
  for (uint32_t c = 100; c < 4900; c += 3) cls[c] = c % 4;
  auto parts = wire::EncodeManifest(12345, cls, 1016);  // 1000 classes per part
  ASSERT_GT(parts.size(), 4u);
  std::vector<uint8_t> back(5000, wire::kNotHere);
  uint32_t owned = 0;
  for (auto& p : parts) {
    ASSERT_LE(p.size(), 1016u);
    auto m = wire::DecodeManifest(p, 5000);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(m->loss_bound_ppm, 12345u);
    owned = m->owned_total;
    std::copy(m->classes.begin(), m->classes.end(), back.begin() + m->first);
  }
  EXPECT_EQ(back, cls);
  EXPECT_EQ(owned, 1600u);
  // Bad input: every field is checked.
  EXPECT_FALSE(wire::DecodeManifest(parts[0], 50).ok());
  std::vector<uint8_t> bad = parts[0];
  bad[16] = 7;  // a class that does not exist
  EXPECT_FALSE(wire::DecodeManifest(bad, 5000).ok());
  bad = parts[0];
  bad[3] = 0xFF;  // ε over 100%
  EXPECT_FALSE(wire::DecodeManifest(bad, 5000).ok());
  EXPECT_FALSE(wire::DecodeManifest(absl::MakeConstSpan(parts[0]).subspan(0, 10), 5000).ok());
  bad = parts[0];
  bad.pop_back();
  EXPECT_FALSE(wire::DecodeManifest(bad, 5000).ok());
}

TEST(BoundedWire, StopRoundTrips) {
  std::vector<wire::ChunkRange> left = {{3, 2}, {10, 1}};
  auto parts = wire::EncodeStop(400, 3, left, 8192);
  ASSERT_EQ(parts.size(), 1u);
  auto s = wire::DecodeStop(parts[0], 20);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->droppable_total, 400u);
  EXPECT_EQ(s->droppable_missing, 3u);
  EXPECT_EQ(s->left_out, left);
  EXPECT_FALSE(wire::DecodeStop(parts[0], 10).ok()) << "range beyond the tensor";
  auto lying = wire::EncodeStop(2, 3, {}, 8192);
  EXPECT_FALSE(wire::DecodeStop(lying[0], 20).ok()) << "more missing than declared";
}

}  // namespace
}  // namespace dlcp::server
