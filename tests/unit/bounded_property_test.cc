// Property test: 10,000 bounded-loss rounds through the real Round and LossTracker, with random
// and bursty loss from 0 to 50% on every message (manifests, pushes and repairs alike), random
// worlds, shapes, classes and ε. Whatever the loss, when a round seals:
//   - no class-0 contribution is missing;
//   - at most floor(ε * droppable) droppable contributions are missing;
//   - every result is exactly the sum of the contributions it counts, and its contributor count
//     is theirs;
//   - every repair asked for every missing class-0 chunk and exactly as many droppable chunks as
//     the bound required;
//   - nothing is summed after the seal.
#include <gtest/gtest.h>

#include <random>

#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "common/faults/drop_injector.h"
#include "common/wire/bounded.h"
#include "server/rounds/round.h"

namespace dlcp::server {
namespace {

constexpr uint32_t kChunkElems = 4;

float Payload(uint32_t w, uint32_t c, uint32_t i) { return static_cast<float>((w * 131 + c * 17 + i * 3) % 97) - 48; }

TEST(BoundedProperty, TenThousandLossyRoundsKeepTheGuarantee) {
  std::mt19937_64 rng(20261129);
  BlockPool pool(64 << 20);
  const double kBounds[] = {0.0, 0.001, 0.01, 0.05, 0.2, 0.5};
  uint64_t sealed_with_loss = 0, total_missing = 0, total_droppable = 0, repairs = 0;
  for (uint32_t n = 0; n < 10000; ++n) {
    const uint32_t world = 1 + rng() % 8;
    const uint32_t chunks = 1 + rng() % 120;
    const double eps = kBounds[rng() % 6];
    DropInjectorOptions net;
    const double p = std::uniform_real_distribution<double>(0, 0.5)(rng);
    net.rate = {p, p, p, p};
    net.burst = std::array<uint32_t, 3>{1, 4, 16}[rng() % 3];
    net.seed = rng();
    DropInjector lossy(net);
    auto job = std::make_shared<Job>(1, "p", world, kChunkElems * 4, uint64_t{1} << 30, 1);
    Round round(job, 1, n, wire::ChunkGeometry{chunks * kChunkElems - static_cast<uint32_t>(rng() % kChunkElems),
                                               kChunkElems},
                &pool, MonotonicNow());
    const wire::ChunkGeometry& g = round.geometry();
    // Each worker pushes a random subset of the chunks here (the rest go to other endpoints),
    // the same subset for all workers, with classes of its own.
    std::vector<bool> here(chunks);
    for (uint32_t c = 0; c < chunks; ++c) here[c] = rng() % 4 != 0;
    here[rng() % chunks] = true;
    std::vector<std::vector<uint8_t>> cls(world, std::vector<uint8_t>(chunks, wire::kNotHere));
    for (uint32_t w = 0; w < world; ++w) {
      for (uint32_t c = 0; c < chunks; ++c) {
        if (here[c]) cls[w][c] = rng() % 10 == 0 ? 0 : 1 + rng() % 3;
      }
    }
    std::vector<std::vector<float>> data(world, std::vector<float>(g.tensor_elems));
    for (uint32_t w = 0; w < world; ++w) {
      for (uint32_t i = 0; i < g.tensor_elems; ++i) data[w][i] = Payload(w, i / kChunkElems, i % kChunkElems);
    }
    auto send_manifest = [&](uint32_t w) {
      // Small parts, so a manifest is several messages, any of which may be lost.
      for (auto& part : wire::EncodeManifest(static_cast<uint32_t>(eps * wire::kPpm), cls[w], 16 + 16)) {
        if (lossy.Drop(0)) continue;
        auto m = wire::DecodeManifest(part, chunks);
        ASSERT_TRUE(m.ok()) << m.status();
        ASSERT_TRUE(round.EnableBounded().AddManifest(w, *m).ok());
      }
    };
    auto push = [&](uint32_t w, uint32_t c) {
      if (lossy.Drop(cls[w][c])) return;
      round.Add(w, c, data[w].data() + g.offset(c), MonotonicNow());
    };
    // Pushes and manifests interleave in any order.
    for (uint32_t w = 0; w < world; ++w) {
      if (rng() % 2) send_manifest(w);
      for (uint32_t c = 0; c < chunks; ++c) {
        if (here[c]) push(w, c);
      }
      send_manifest(w);
    }
    int turns = 0;
    while (true) {
      ASSERT_LT(++turns, 10000) << "round " << n << " never met its bound";
      LossTracker& t = round.EnableBounded();
      if (t.AllIn()) break;
      if (t.BoundMet()) {
        // The tail: stragglers may still arrive before it ends, but nothing is asked for.
        if (rng() % 2) {
          for (uint32_t w = 0; w < world; ++w) {
            for (uint32_t c = 0; c < chunks; ++c) {
              if (here[c] && !t.got(w, c) && rng() % 3 == 0) push(w, c);
            }
          }
        }
        break;
      }
      for (uint32_t w = 0; w < world; ++w) {
        if (!t.has_manifest(w)) send_manifest(w);
      }
      if (!t.manifests_complete()) continue;
      // Quiet: the workers ask for their missing results, which tells how far each has pushed.
      for (uint32_t w = 0; w < world; ++w) t.MarkSentThrough(w, chunks - 1);
      const auto plan = t.RepairPlan(n);
      ++repairs;
      uint64_t class0 = 0, droppable = 0;
      for (uint32_t w = 0; w < world; ++w) {
        for (uint32_t c : plan[w]) {
          ASSERT_FALSE(t.got(w, c));
          (cls[w][c] == 0 ? class0 : droppable)++;
        }
      }
      ASSERT_EQ(class0, t.class0_missing());
      ASSERT_EQ(droppable, t.droppable_missing() > t.allowed_missing() ? t.droppable_missing() - t.allowed_missing() : 0);
      for (uint32_t w = 0; w < world; ++w) {
        for (uint32_t c : plan[w]) push(w, c);
      }
    }
    LossTracker& t = round.EnableBounded();
    ASSERT_TRUE(t.BoundMet());
    round.Seal();
    // The guarantee, counted independently of the tracker.
    uint64_t missing = 0, droppable = 0;
    for (uint32_t c = 0; c < chunks; ++c) {
      if (!here[c]) continue;
      uint32_t contributors = 0;
      for (uint32_t w = 0; w < world; ++w) {
        const bool in = round.Has(w, c);
        contributors += in;
        if (cls[w][c] == 0) {
          ASSERT_TRUE(in) << "round " << n << ": class-0 chunk " << c << " of worker " << w << " missing at seal";
        } else {
          ++droppable;
          missing += !in;
        }
      }
      ASSERT_EQ(round.contributors(c), contributors);
      const float* sum = round.Result(c);
      ASSERT_EQ(sum == nullptr, contributors == 0);
      for (uint32_t i = 0; i < g.elems(c) && sum != nullptr; ++i) {
        float want = 0;
        for (uint32_t w = 0; w < world; ++w) {
          if (round.Has(w, c)) want += data[w][g.offset(c) + i];
        }
        ASSERT_EQ(sum[i], want) << "round " << n << " chunk " << c << " element " << i;
      }
      for (uint32_t w = 0; w < world; ++w) {
        if (!round.Has(w, c)) {
          ASSERT_EQ(round.Add(w, c, data[w].data() + g.offset(c), MonotonicNow()), Round::AddResult::kSealed);
        }
      }
    }
    ASSERT_EQ(droppable, t.droppable_total());
    ASSERT_EQ(missing, t.droppable_missing());
    ASSERT_LE(missing, static_cast<uint64_t>(eps * droppable + 1e-9)) << "round " << n << " eps " << eps;
    sealed_with_loss += missing > 0;
    total_missing += missing;
    total_droppable += droppable;
  }
  // The bound was exercised, not just trivially met.
  EXPECT_GT(sealed_with_loss, 1000u);
  EXPECT_GT(repairs, 5000u);
  std::cout << "10000 rounds: " << total_missing << " of " << total_droppable << " droppable contributions left out, "
            << sealed_with_loss << " rounds sealed with loss, " << repairs << " repair turns\n";
}

}  // namespace
}  // namespace dlcp::server
