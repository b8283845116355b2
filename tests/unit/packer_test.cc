// The CPU packer, the reference every other packer must match byte for byte: its packets parse
// back to the right headers and values, its classes are the class policy's, and odd shapes work.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "client/packer/cpu/cpu_packer.h"
#include "common/classes/class_policy.h"
#include "common/wire/header.h"

namespace dlcp {
namespace {

std::vector<float> RandomValues(uint32_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> v(n);
  // Chunks of very different magnitude, so the classes spread.
  for (uint32_t i = 0; i < n; ++i) v[i] = normal(rng) * static_cast<float>(1 + (i / 97) % 13);
  return v;
}

PackInput Input(const std::vector<float>& data, uint32_t chunk_elems, wire::Encoding e) {
  PackInput in;
  in.data = data.data();
  in.tensors = {PackTensor{0, static_cast<uint32_t>(data.size()), 7, 3, 2, 99}};
  in.chunk_elems = chunk_elems;
  in.job = 0xABCD;
  in.rank = 5;
  in.num_layers = 8;
  in.encoding = e;
  return in;
}

struct Packed {
  PackLayout layout;
  PackOutput out;
  std::vector<uint8_t> packets;
};

Packed Pack(const PackInput& in, const ClassPolicyOptions& policy = {}) {
  Packed p;
  absl::StatusOr<PackLayout> layout = PlanPack(in, policy);
  EXPECT_TRUE(layout.ok()) << layout.status();
  p.layout = *layout;
  p.packets.assign(p.layout.packet_bytes(), 0xA5);  // poison: every byte must be written
  p.out.packets = p.packets.data();
  auto packer = CreateCpuPacker(policy);
  EXPECT_TRUE(packer.ok());
  absl::Status s = (*packer)->Pack(in, &p.out);
  EXPECT_TRUE(s.ok()) << s;
  return p;
}

// The straightforward definition: magnitude in index order, a full sort, thirds of the score.
std::vector<uint8_t> NaiveClasses(const std::vector<float>& v, uint32_t chunk_elems, double fraction, uint32_t layer,
                                  uint32_t layers) {
  const wire::ChunkGeometry g{static_cast<uint32_t>(v.size()), chunk_elems};
  std::vector<std::pair<double, uint32_t>> m;
  for (uint32_t c = 0; c < g.chunk_count(); ++c) {
    double s = 0;
    for (uint32_t i = 0; i < g.elems(c); ++i) s += static_cast<double>(v[g.offset(c) + i]) * v[g.offset(c) + i];
    m.push_back({-s, c});
  }
  std::sort(m.begin(), m.end());
  const uint32_t n = g.chunk_count();
  const uint32_t reliable = std::min<uint32_t>(n, static_cast<uint32_t>(std::ceil(fraction * n - 1e-9)));
  std::vector<uint8_t> classes(n);
  for (uint32_t i = 0; i < n; ++i) {
    if (i < reliable) {
      classes[m[i].second] = 0;
      continue;
    }
    const double score = (static_cast<double>(i - reliable) / (n - reliable) + static_cast<double>(layer) / layers) / 2;
    classes[m[i].second] = static_cast<uint8_t>(1 + std::min(2, static_cast<int>(3 * score)));
  }
  return classes;
}

class PackerRoundTrip : public ::testing::TestWithParam<std::tuple<uint32_t, uint32_t, wire::Encoding>> {};

TEST_P(PackerRoundTrip, PacketsParseBackToTheTensor) {
  const auto [elems, chunk_elems, encoding] = GetParam();
  const std::vector<float> data = RandomValues(elems, elems);
  const PackInput in = Input(data, chunk_elems, encoding);
  Packed p = Pack(in);
  const wire::ChunkGeometry g{elems, chunk_elems};
  ASSERT_EQ(p.layout.chunks(), g.chunk_count());
  const uint32_t width = wire::EncodingWidth(encoding);
  for (uint32_t c = 0; c < g.chunk_count(); ++c) {
    const uint8_t* packet = p.packets.data() + c * p.layout.stride;
    const size_t len = wire::kHeaderSize + g.elems(c) * width;
    wire::Header h;
    ASSERT_EQ(wire::ParseHeader(absl::MakeConstSpan(packet, len), &h), wire::Reject::kNone) << "chunk " << c;
    EXPECT_EQ(h.type, wire::MsgType::kPush);
    EXPECT_EQ(h.priority, p.out.classes[c]);
    EXPECT_EQ(h.job, 0xABCDu);
    EXPECT_EQ(h.key, 7u);
    EXPECT_EQ(h.round, 3u);
    EXPECT_EQ(h.chunk, c);
    EXPECT_EQ(h.chunk_count, g.chunk_count());
    EXPECT_EQ(h.tensor_elems, elems);
    EXPECT_EQ(h.rank, 5);
    EXPECT_EQ(h.epoch, 99u);
    EXPECT_EQ(h.encoding, static_cast<uint8_t>(encoding));
    for (uint32_t i = 0; i < g.elems(c); ++i) {
      const float want = data[g.offset(c) + i];
      const float got = wire::LoadValue(packet + wire::kHeaderSize, i, encoding);
      const float rounded = encoding == wire::Encoding::kF16    ? wire::F16ToF32(wire::F32ToF16(want))
                            : encoding == wire::Encoding::kBF16 ? wire::BF16ToF32(wire::F32ToBF16(want))
                                                                : want;
      ASSERT_EQ(got, rounded) << "chunk " << c << " value " << i;
    }
  }
  // Dense: the last packet ends at the buffer's end, so nothing is left unwritten.
  const uint32_t last = g.chunk_count() - 1;
  EXPECT_EQ(p.layout.packet_bytes(), last * p.layout.stride + wire::kHeaderSize + g.elems(last) * width);
  // Classes: exactly the policy's (the same rules the data path used before the packer).
  auto policy = CreateClassPolicy({});
  std::vector<uint8_t> want(g.chunk_count());
  (*policy)->Classify(data, g, TensorInfo{2, 8}, absl::MakeSpan(want));
  EXPECT_EQ(p.out.classes, want);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PackerRoundTrip,
    ::testing::Combine(::testing::Values(1u, 5u, 255u, 256u, 257u, 2048u, 100003u), ::testing::Values(1u, 64u, 2048u),
                       ::testing::Values(wire::Encoding::kF32, wire::Encoding::kF16, wire::Encoding::kBF16)));

TEST(Packer, ClassesMatchTheStraightforwardDefinition) {
  for (uint32_t elems : {3000u, 65536u, 99991u}) {
    const std::vector<float> data = RandomValues(elems, elems + 1);
    for (double fraction : {0.0, 0.1, 0.5, 1.0}) {
      ClassPolicyOptions policy;
      policy.reliable_fraction = fraction;
      Packed p = Pack(Input(data, 256, wire::Encoding::kF32), policy);
      // Lane order changes the last bits of a sum, never the rank of such distinct magnitudes.
      EXPECT_EQ(p.out.classes, NaiveClasses(data, 256, fraction, 2, 8)) << elems << " " << fraction;
      uint32_t class0 = 0;
      for (uint8_t c : p.out.classes) class0 += c == 0;
      EXPECT_EQ(class0, static_cast<uint32_t>(std::ceil(fraction * p.out.classes.size() - 1e-9)));
    }
  }
}

TEST(Packer, MagnitudesFollowTheLaneDefinition) {
  const std::vector<float> data = RandomValues(1000, 3);
  Packed p = Pack(Input(data, 1000, wire::Encoding::kF32));
  double lanes[kNormLanes] = {};
  for (uint32_t i = 0; i < 1000; ++i) lanes[i % kNormLanes] += static_cast<double>(data[i]) * data[i];
  FoldLanes(lanes);
  ASSERT_EQ(p.out.magnitudes.size(), 1u);
  EXPECT_EQ(p.out.magnitudes[0], lanes[0]);
}

TEST(Packer, SixteenBitTensorsPackLikeTheirFloat32Values) {
  const std::vector<float> data = RandomValues(5000, 9);
  std::vector<uint16_t> half(data.size()), brain(data.size());
  std::vector<float> half_f(data.size()), brain_f(data.size());
  for (size_t i = 0; i < data.size(); ++i) {
    half[i] = wire::F32ToF16(data[i]);
    brain[i] = wire::F32ToBF16(data[i]);
    half_f[i] = wire::F16ToF32(half[i]);
    brain_f[i] = wire::BF16ToF32(brain[i]);
  }
  for (auto [raw, widened, type] : {std::tuple{half.data(), &half_f, ElemType::kF16},
                                    std::tuple{brain.data(), &brain_f, ElemType::kBF16}}) {
    PackInput in = Input(*widened, 300, wire::Encoding::kF16);
    Packed want = Pack(in);
    in.data = raw;
    in.type = type;
    Packed got = Pack(in);
    EXPECT_EQ(got.packets, want.packets);
    EXPECT_EQ(got.out.classes, want.out.classes);
    EXPECT_EQ(got.out.magnitudes, want.out.magnitudes);
  }
}

TEST(Packer, SeveralTensorsAreClassedEachOnItsOwn) {
  const std::vector<float> a = RandomValues(3000, 1), b = RandomValues(70, 2);
  std::vector<float> both = a;
  both.insert(both.end(), b.begin(), b.end());
  PackInput in = Input(both, 64, wire::Encoding::kBF16);
  in.tensors = {PackTensor{0, 3000, 1, 0, 0, 5}, PackTensor{3000, 70, 2, 0, 7, 5}};
  Packed p = Pack(in);
  PackInput ia = Input(a, 64, wire::Encoding::kBF16);
  ia.tensors[0] = in.tensors[0];
  PackInput ib = Input(b, 64, wire::Encoding::kBF16);
  ib.tensors[0] = in.tensors[1];
  ib.tensors[0].offset = 0;
  Packed pa = Pack(ia), pb = Pack(ib);
  std::vector<uint8_t> packets = pa.packets;
  packets.insert(packets.end(), pb.packets.begin(), pb.packets.end());
  EXPECT_EQ(p.packets, packets);
  std::vector<uint8_t> classes = pa.out.classes;
  classes.insert(classes.end(), pb.out.classes.begin(), pb.out.classes.end());
  EXPECT_EQ(p.out.classes, classes);
}

// The data path marks a round with ε = 0 reliable; the packer then classes by the layer alone, as
// the policy does, and still measures every chunk.
TEST(Packer, AReliableTensorRidesOneClass) {
  const std::vector<float> a = RandomValues(3000, 1), b = RandomValues(3000, 2);
  std::vector<float> both = a;
  both.insert(both.end(), b.begin(), b.end());
  PackInput in = Input(both, 64, wire::Encoding::kF32);
  in.num_layers = 8;
  in.tensors = {PackTensor{0, 3000, 1, 0, 7, 5, /*loss_bound=*/0.0}, PackTensor{3000, 3000, 2, 0, 7, 5}};
  Packed p = Pack(in);
  const uint32_t chunks = wire::ChunkGeometry{3000, 64}.chunk_count();
  ASSERT_EQ(p.out.classes.size(), 2u * chunks);
  for (uint32_t c = 0; c < chunks; ++c) ASSERT_EQ(p.out.classes[c], 3) << c;
  auto policy = CreateClassPolicy({});
  std::vector<uint8_t> want(chunks);
  (*policy)->Classify(b, wire::ChunkGeometry{3000, 64}, TensorInfo{7, 8}, absl::MakeSpan(want));
  EXPECT_EQ(std::vector<uint8_t>(p.out.classes.begin() + chunks, p.out.classes.end()), want);
  EXPECT_NE(*std::min_element(want.begin(), want.end()), 3) << "the bounded tensor is ranked";
  EXPECT_GT(p.out.magnitudes[0], 0.0);
}

TEST(Packer, NonFiniteChunksAreClassZero) {
  std::vector<float> data(1024, 0.5f);
  data[700] = NAN;
  data[100] = INFINITY;
  ClassPolicyOptions policy;
  policy.reliable_fraction = 0.25;  // 4 chunks of 256: exactly one reliable... plus ties
  Packed p = Pack(Input(data, 256, wire::Encoding::kF32), policy);
  EXPECT_EQ(p.out.classes[0], 0);  // chunk 0 holds the infinity and ranks first
  EXPECT_NE(p.out.classes[2], 0);  // the NaN ranks second, past the one reliable slot
  EXPECT_EQ(MagnitudeOrderKey(p.out.magnitudes[2]), MagnitudeOrderKey(INFINITY));
}

TEST(Packer, UniformPolicyAndMagnitudesOnly) {
  const std::vector<float> data = RandomValues(1000, 4);
  PackInput in = Input(data, 100, wire::Encoding::kF32);
  in.write_packets = false;
  ClassPolicyOptions uniform{ClassPolicyOptions::Kind::kUniform, 0, 2};
  auto packer = CreateCpuPacker(uniform);
  ASSERT_TRUE(packer.ok());
  PackOutput out;  // no packet buffer needed
  ASSERT_TRUE((*packer)->Pack(in, &out).ok());
  EXPECT_EQ(out.classes, std::vector<uint8_t>(10, 2));
  EXPECT_EQ(out.magnitudes.size(), 10u);
}

TEST(Packer, BadInputIsAnError) {
  const std::vector<float> data(10, 1.0f);
  auto packer = CreateCpuPacker({});
  ASSERT_TRUE(packer.ok());
  PackOutput out;
  PackInput in = Input(data, 4, wire::Encoding::kF32);
  EXPECT_EQ((*packer)->Pack(in, &out).code(), absl::StatusCode::kInvalidArgument);  // no packet buffer
  in.write_packets = false;
  in.chunk_elems = 0;
  EXPECT_EQ((*packer)->Pack(in, &out).code(), absl::StatusCode::kInvalidArgument);
  in.chunk_elems = 20000;  // 80000 bytes: over a datagram
  EXPECT_EQ((*packer)->Pack(in, &out).code(), absl::StatusCode::kInvalidArgument);
  in.chunk_elems = 4;
  in.tensors[0].elems = 0;
  EXPECT_EQ((*packer)->Pack(in, &out).code(), absl::StatusCode::kInvalidArgument);
  in.tensors.clear();
  EXPECT_EQ((*packer)->Pack(in, &out).code(), absl::StatusCode::kInvalidArgument);
  in = Input(data, 4, wire::Encoding::kF32);
  in.rank = 70000;
  EXPECT_EQ((*packer)->Pack(in, &out).code(), absl::StatusCode::kInvalidArgument);
  in = Input(data, 4, wire::Encoding::kF32);
  in.write_packets = false;
  in.type = static_cast<ElemType>(7);  // not a type a tensor holds: never read as some other one
  EXPECT_EQ((*packer)->Pack(in, &out).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(CreateCpuPacker({ClassPolicyOptions::Kind::kUniform, 0, 4}).ok());
}

TEST(Packer, AutoFallsBackToTheCpuWithoutADevice) {
  if (CudaPackerAvailable().ok()) GTEST_SKIP() << "a CUDA device is present; dlcp_cuda_tests covers it";
  auto packer = CreatePacker({PackerOptions::Device::kAuto});
  ASSERT_TRUE(packer.ok()) << packer.status();
  EXPECT_STREQ((*packer)->name(), "cpu");
  auto cuda = CreatePacker({PackerOptions::Device::kCuda});
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(cuda.status().message().empty());
}

}  // namespace
}  // namespace dlcp
