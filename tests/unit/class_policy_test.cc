#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "common/classes/class_policy.h"
#include "common/faults/drop_injector.h"
#include "common/classes/phase_aware.h"

namespace dlcp {
namespace {

// 100 chunks of 4 floats; chunk c's elements all equal `mag(c)`.
std::vector<float> Tensor(const std::vector<float>& mags) {
  std::vector<float> t;
  for (float m : mags) t.insert(t.end(), 4, m);
  return t;
}

std::vector<uint8_t> Classify(const ClassPolicyOptions& o, const std::vector<float>& data, TensorInfo info = {}) {
  auto p = CreateClassPolicy(o);
  EXPECT_TRUE(p.ok());
  wire::ChunkGeometry g{static_cast<uint32_t>(data.size()), 4};
  std::vector<uint8_t> cls(g.chunk_count(), 99);
  (*p)->Classify(data, g, info, absl::MakeSpan(cls));
  return cls;
}

TEST(ClassPolicy, TopReliableFractionByNormGoesToClassZero) {
  std::vector<float> mags(100);
  for (int c = 0; c < 100; ++c) mags[c] = static_cast<float>((c * 37) % 100) - 50;  // signs do not matter
  const std::vector<uint8_t> cls = Classify({}, Tensor(mags));
  int zero = 0;
  for (int c = 0; c < 100; ++c) {
    if (cls[c] == 0) {
      ++zero;
      EXPECT_GE(std::fabs(mags[c]), 45) << c;  // |m| in 46..50 are the ten largest, with -50
    }
    EXPECT_LE(cls[c], 3);
  }
  EXPECT_EQ(zero, 10);
}

TEST(ClassPolicy, DroppableChunksSpreadOverThreeClassesByMagnitude) {
  std::vector<float> mags(100);
  for (int c = 0; c < 100; ++c) mags[c] = static_cast<float>(100 - c);  // chunk 0 largest
  const std::vector<uint8_t> cls = Classify({}, Tensor(mags));
  EXPECT_EQ(cls[0], 0);
  EXPECT_EQ(cls[9], 0);
  EXPECT_EQ(cls[10], 1);
  EXPECT_EQ(cls[50], 2);
  EXPECT_EQ(cls[99], 3);
  EXPECT_TRUE(std::is_sorted(cls.begin(), cls.end())) << "a smaller chunk must never rank above a larger one";
}

TEST(ClassPolicy, LayersNearTheInputRankFirst) {
  std::vector<float> mags(100, 1.0f);
  const auto input = Classify({}, Tensor(mags), TensorInfo{0, 10});
  const auto output = Classify({}, Tensor(mags), TensorInfo{9, 10});
  int in_sum = 0, out_sum = 0;
  for (int c = 0; c < 100; ++c) {
    in_sum += input[c];
    out_sum += output[c];
  }
  EXPECT_LT(in_sum, out_sum);
  EXPECT_EQ(*std::max_element(input.begin(), input.end()), 2);    // the input layer never rides class 3
  EXPECT_EQ(*std::min_element(output.begin() + 10, output.end()), 2);  // nor the output layer class 1
}

// In a reliable round every chunk must arrive, so its magnitude says nothing about which may wait:
// the whole tensor rides the class its layer earns, and class 0 stays free for control and repairs.
TEST(ClassPolicy, AReliableTensorRidesTheClassItsLayerEarns) {
  std::vector<float> mags(100);
  for (int c = 0; c < 100; ++c) mags[c] = static_cast<float>(100 - c);
  auto only = [](const std::vector<uint8_t>& cls, uint8_t want) {
    return std::all_of(cls.begin(), cls.end(), [&](uint8_t c) { return c == want; });
  };
  EXPECT_TRUE(only(Classify({}, Tensor(mags), TensorInfo{0, 0, 0.0}), 1)) << "depth unknown";
  EXPECT_TRUE(only(Classify({}, Tensor(mags), TensorInfo{0, 10, 0.0}), 1));
  EXPECT_TRUE(only(Classify({}, Tensor(mags), TensorInfo{5, 10, 0.0}), 2));
  EXPECT_TRUE(only(Classify({}, Tensor(mags), TensorInfo{9, 10, 0.0}), 3));
  ClassPolicyOptions all;
  all.reliable_fraction = 1;
  EXPECT_TRUE(only(Classify(all, Tensor(mags), TensorInfo{9, 10, 0.0}), 3)) << "the fraction ranks, and nothing is ranked";
  // rank_reliable: ranked as in a bounded round.
  ClassPolicyOptions ranked;
  ranked.rank_reliable = true;
  EXPECT_EQ(Classify(ranked, Tensor(mags), TensorInfo{5, 10, 0.0}), Classify({}, Tensor(mags), TensorInfo{5, 10}));
  EXPECT_EQ(Classify(ranked, Tensor(mags), TensorInfo{5, 10, 0.0})[0], 0);
  // The uniform policy's class wins either way.
  ClassPolicyOptions uniform{ClassPolicyOptions::Kind::kUniform, 0, 0};
  EXPECT_TRUE(only(Classify(uniform, Tensor(mags), TensorInfo{9, 10, 0.0}), 0));
}

// Under a bound ε, class 3 holds the bottom ε of the droppable chunks and class 2 the next 2ε:
// the round must receive all but ε of them, so the class strict priority starves holds no more.
TEST(ClassPolicy, TheLowestClassesAreSizedByTheBound) {
  std::vector<float> mags(100);
  for (int c = 0; c < 100; ++c) mags[c] = static_cast<float>(100 - c);  // chunk 0 largest
  ClassPolicyOptions none;
  none.reliable_fraction = 0;
  const auto cls = Classify(none, Tensor(mags), TensorInfo{0, 0, 0.05});
  std::array<int, 4> count{};
  for (uint8_t c : cls) ++count[c];
  EXPECT_EQ(count, (std::array<int, 4>{0, 85, 10, 5}));
  EXPECT_TRUE(std::is_sorted(cls.begin(), cls.end()));
  // A bound of a third or more, or none known, keeps thirds.
  EXPECT_EQ(Classify(none, Tensor(mags), TensorInfo{0, 0, 0.5}), Classify(none, Tensor(mags)));
  EXPECT_EQ(Classify(none, Tensor(mags), TensorInfo{0, 0, 1.0 / 3}), Classify(none, Tensor(mags)));
}

TEST(ClassPolicy, NonFiniteGradientsAreNeverDropped) {
  std::vector<float> mags(20, 1.0f);
  mags[7] = NAN;
  mags[13] = INFINITY;
  ClassPolicyOptions o;
  o.reliable_fraction = 0.1;  // two chunks
  const auto cls = Classify(o, Tensor(mags));
  EXPECT_EQ(cls[7], 0);
  EXPECT_EQ(cls[13], 0);
}

TEST(ClassPolicy, ExtremesAndValidation) {
  std::vector<float> mags(30, 2.0f);
  ClassPolicyOptions all;
  all.reliable_fraction = 1;
  for (uint8_t c : Classify(all, Tensor(mags))) EXPECT_EQ(c, 0);
  ClassPolicyOptions none;
  none.reliable_fraction = 0;
  for (uint8_t c : Classify(none, Tensor(mags))) EXPECT_NE(c, 0);
  ClassPolicyOptions uniform{ClassPolicyOptions::Kind::kUniform, 0, 2};
  for (uint8_t c : Classify(uniform, Tensor(mags))) EXPECT_EQ(c, 2);
  EXPECT_FALSE(CreateClassPolicy({ClassPolicyOptions::Kind::kMagnitudeLayer, 1.5, 0}).ok());
  EXPECT_FALSE(CreateClassPolicy({ClassPolicyOptions::Kind::kUniform, 0, 4}).ok());
  EXPECT_TRUE(ParseClassPolicyKind("uniform").ok());
  EXPECT_FALSE(ParseClassPolicyKind("random").ok());
}

TEST(DropInjector, RatesPerClassAndBurstsAreDeterministic) {
  DropInjectorOptions o;
  ASSERT_TRUE(ParseClassDrops("1:0.1,3:0.5", &o.rate).ok());
  EXPECT_EQ(FormatClassDrops(o.rate), "1:0.1,3:0.5");
  o.burst = 8;
  DropInjector a(o), b(o);
  int dropped[4] = {}, longest = 0, run = 0;
  for (int i = 0; i < 200000; ++i) {
    const uint8_t cls = i % 4;
    const bool d = a.Drop(cls);
    EXPECT_EQ(d, b.Drop(cls));
    dropped[cls] += d;
    if (cls == 1) {
      run = d ? run + 1 : 0;
      longest = std::max(longest, run);
    }
  }
  EXPECT_EQ(dropped[0], 0);
  EXPECT_EQ(dropped[2], 0);
  EXPECT_NEAR(dropped[1] / 50000.0, 0.1, 0.02);
  EXPECT_NEAR(dropped[3] / 50000.0, 0.5, 0.08);
  EXPECT_GE(longest, 8);  // bursts take out runs of consecutive packets
  std::array<double, 4> r{};
  EXPECT_FALSE(ParseClassDrops("4:0.1", &r).ok());
  EXPECT_FALSE(ParseClassDrops("1:1.5", &r).ok());
  EXPECT_FALSE(ParseClassDrops("1-0.5", &r).ok());
}

}  // namespace
}  // namespace dlcp

namespace dlcp {
namespace {

TEST(PhaseAware, BoundRelaxesOutsideCriticalPhasesAndTightensWhenTheNormJumps) {
  PhaseAwareBound b({true, 3.0, 0.5, 2});
  EXPECT_DOUBLE_EQ(b.Next(1, 0.01, 10.0), 0.01);  // first round: critical
  EXPECT_DOUBLE_EQ(b.Next(1, 0.01, 10.5), 0.01);  // still held
  EXPECT_DOUBLE_EQ(b.Next(1, 0.01, 11.0), 0.03);  // calm: relaxed
  EXPECT_FALSE(b.critical(1));
  EXPECT_DOUBLE_EQ(b.Next(1, 0.01, 20.0), 0.01);  // +82%: critical again
  EXPECT_TRUE(b.critical(1));
  EXPECT_DOUBLE_EQ(b.Next(1, 0.01, 19.0), 0.01);
  EXPECT_DOUBLE_EQ(b.Next(1, 0.01, 18.5), 0.03);
  EXPECT_DOUBLE_EQ(b.Next(1, 0.01, 5.0), 0.01);   // a 73% drop counts too
  EXPECT_DOUBLE_EQ(b.Next(2, 0.4, 1.0), 0.4);     // keys are independent
  EXPECT_DOUBLE_EQ(b.Next(2, 0.4, 1.0), 0.4);
  EXPECT_DOUBLE_EQ(b.Next(2, 0.4, 1.0), 1.0);     // never above 1
}

}  // namespace
}  // namespace dlcp
