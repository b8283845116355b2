// dlcp_cuda_tests: the CUDA packer against the CPU reference. Every test needs a device and is
// skipped, saying why, where there is none (cudaGetDeviceCount fails with error 35 on a machine
// without a driver). scripts/gpu-check.sh runs these on a GPU machine.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/packer/cpu/cpu_packer.h"
#include "client/packer/packer.h"

namespace dlcp {
namespace {

#define REQUIRE_CUDA()                                                          \
  do {                                                                          \
    if (absl::Status s = CudaPackerAvailable(); !s.ok()) GTEST_SKIP() << s;     \
  } while (0)
#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

// Raw tensor bytes of `type`, with magnitudes that vary by chunk, some repeated values and a NaN;
// or every element `constant`, so that every full chunk's magnitude ties and ranks by index.
std::vector<uint8_t> RandomTensor(ElemType type, uint64_t n, uint32_t seed, std::optional<float> constant) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0, 1);
  std::vector<uint8_t> bytes(n * ElemWidth(type));
  for (uint64_t i = 0; i < n; ++i) {
    float v = normal(rng) * static_cast<float>(1 + (i / 331) % 17);
    if (i % 5003 == 17) v = 0.25f;
    if (i == n / 2 && n > 1000) v = NAN;
    if (constant) v = *constant;
    if (type == ElemType::kF32) {
      memcpy(&bytes[4 * i], &v, 4);
    } else {
      const uint16_t h = type == ElemType::kF16 ? wire::F32ToF16(v) : wire::F32ToBF16(v);
      memcpy(&bytes[2 * i], &h, 2);
    }
  }
  return bytes;
}

struct Case {
  ElemType type;
  wire::Encoding encoding;
  std::vector<uint32_t> sizes;  // tensors, packed together
  uint32_t chunk_elems;
  ClassPolicyOptions policy;
  std::optional<float> constant;
};

std::string Describe(const Case& c) {
  std::string s = absl::StrCat("type ", static_cast<int>(c.type), " encoding ", wire::EncodingName(c.encoding),
                               " chunk ", c.chunk_elems, " sizes");
  for (uint32_t n : c.sizes) absl::StrAppend(&s, " ", n);
  if (c.constant) absl::StrAppend(&s, " all ", *c.constant);
  return s;
}

void CheckIdentical(const Case& c, bool pinned_output) {
  uint64_t total = 0;
  PackInput in;
  in.type = c.type;
  in.chunk_elems = c.chunk_elems;
  in.job = 77;
  in.rank = 3;
  in.num_layers = 12;
  in.encoding = c.encoding;
  for (size_t t = 0; t < c.sizes.size(); ++t) {
    // Every kind of round: ε unknown (thirds), reliable (one class by layer), and two bounds
    // that size classes 2 and 3.
    constexpr double kBounds[] = {-1, 0, 0.01, 0.05};
    in.tensors.push_back(PackTensor{total, c.sizes[t], static_cast<uint32_t>(100 + t), 9, static_cast<uint32_t>(t),
                                    0xC0FFEE, kBounds[t % 4]});
    total += c.sizes[t];
  }
  const std::vector<uint8_t> host = RandomTensor(c.type, total, static_cast<uint32_t>(total), c.constant);
  in.data = host.data();
  absl::StatusOr<PackLayout> layout = PlanPack(in, c.policy);
  ASSERT_TRUE(layout.ok()) << layout.status();
  std::vector<uint8_t> want(layout->packet_bytes());
  PackOutput cpu_out;
  cpu_out.packets = want.data();
  ASSERT_TRUE((*CreateCpuPacker(c.policy))->Pack(in, &cpu_out).ok());

  void* device_in = nullptr;
  ASSERT_CUDA(cudaMalloc(&device_in, host.size()));
  ASSERT_CUDA(cudaMemcpy(device_in, host.data(), host.size(), cudaMemcpyHostToDevice));
  uint8_t* packets = nullptr;
  if (pinned_output) {
    ASSERT_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&packets), want.size(), cudaHostAllocDefault));
  } else {
    ASSERT_CUDA(cudaMalloc(reinterpret_cast<void**>(&packets), want.size()));
  }
  auto packer = CreatePacker({PackerOptions::Device::kCuda, 0, c.policy});
  ASSERT_TRUE(packer.ok()) << packer.status();
  in.data = device_in;
  // Two poisons: a byte the kernel never wrote would keep one of them and differ from the CPU.
  for (uint8_t poison : {uint8_t{0xA5}, uint8_t{0x5A}}) {
    if (pinned_output) {
      memset(packets, poison, want.size());
    } else {
      ASSERT_CUDA(cudaMemset(packets, poison, want.size()));
    }
    PackOutput gpu_out;
    gpu_out.packets = packets;
    absl::Status s = (*packer)->Pack(in, &gpu_out);
    ASSERT_TRUE(s.ok()) << s;
    std::vector<uint8_t> got(want.size());
    if (pinned_output) {
      memcpy(got.data(), packets, got.size());
    } else {
      ASSERT_CUDA(cudaMemcpy(got.data(), packets, got.size(), cudaMemcpyDeviceToHost));
    }
    size_t first_diff = 0;
    while (first_diff < got.size() && got[first_diff] == want[first_diff]) ++first_diff;
    EXPECT_EQ(first_diff, got.size()) << Describe(c) << ": packets differ first at byte " << first_diff
                                       << " (packet " << first_diff / layout->stride << ")";
    EXPECT_EQ(gpu_out.classes, cpu_out.classes) << Describe(c);
    ASSERT_EQ(gpu_out.magnitudes.size(), cpu_out.magnitudes.size());
    EXPECT_EQ(0, memcmp(gpu_out.magnitudes.data(), cpu_out.magnitudes.data(), 8 * cpu_out.magnitudes.size()))
        << Describe(c) << ": magnitudes differ in their bits";
  }
  cudaFree(device_in);
  if (pinned_output) {
    cudaFreeHost(packets);
  } else {
    cudaFree(packets);
  }
}

TEST(CudaPacker, ByteIdenticalToTheCpuOverManySizes) {
  REQUIRE_CUDA();
  for (uint32_t n : {1u, 5u, 255u, 256u, 257u, 2047u, 2048u, 2049u, 100003u, (1u << 22) + 13}) {
    for (uint32_t chunk : {64u, 2048u, 16000u}) {
      ASSERT_NO_FATAL_FAILURE(CheckIdentical({ElemType::kF32, wire::Encoding::kF32, {n}, chunk, {}}, false));
    }
  }
}

TEST(CudaPacker, ByteIdenticalForEveryTypeAndEncoding) {
  REQUIRE_CUDA();
  for (ElemType type : {ElemType::kF32, ElemType::kF16, ElemType::kBF16}) {
    for (wire::Encoding e : {wire::Encoding::kF32, wire::Encoding::kF16, wire::Encoding::kBF16}) {
      ASSERT_NO_FATAL_FAILURE(CheckIdentical({type, e, {300007}, 2048, {}}, false));
    }
  }
}

TEST(CudaPacker, ByteIdenticalForSeveralTensorsAndPolicies) {
  REQUIRE_CUDA();
  const std::vector<uint32_t> sizes = {10, 70000, 1, 4096, 123457};
  for (double fraction : {0.0, 0.1, 0.37, 1.0}) {
    ClassPolicyOptions policy;
    policy.reliable_fraction = fraction;
    ASSERT_NO_FATAL_FAILURE(CheckIdentical({ElemType::kF32, wire::Encoding::kBF16, sizes, 1024, policy}, false));
  }
  ASSERT_NO_FATAL_FAILURE(CheckIdentical(
      {ElemType::kF16, wire::Encoding::kF16, sizes, 1024, {ClassPolicyOptions::Kind::kUniform, 0, 3}}, false));
}

// The packer counts ranks for tensors of up to 8192 chunks and radix-sorts larger ones; each of
// these cases has one of each, or a tensor just past the boundary alongside small ones (every
// tensor of a call ranks the same way).
TEST(CudaPacker, ByteIdenticalWhetherRanksAreCountedOrSorted) {
  REQUIRE_CUDA();
  for (uint32_t chunks : {8191u, 8192u, 8193u}) {
    ASSERT_NO_FATAL_FAILURE(CheckIdentical({ElemType::kF32, wire::Encoding::kF32, {64 * chunks - 5}, 64, {}}, false));
  }
  ASSERT_NO_FATAL_FAILURE(
      CheckIdentical({ElemType::kF32, wire::Encoding::kF32, {10, 64 * 8193, 1, 4096, 5000}, 64, {}}, false));
  for (float constant : {1.0f, 0.0f}) {  // every full chunk ties: ranks by index alone
    for (uint32_t n : {64u * 1000 + 3, 64u * 9000 + 3}) {
      ASSERT_NO_FATAL_FAILURE(
          CheckIdentical({ElemType::kF32, wire::Encoding::kF32, {n, 700}, 64, {}, constant}, false));
    }
  }
}

TEST(CudaPacker, WritesIntoPinnedHostMemory) {
  REQUIRE_CUDA();
  ASSERT_NO_FATAL_FAILURE(CheckIdentical({ElemType::kF32, wire::Encoding::kF16, {1000003}, 2048, {}}, true));
}

TEST(CudaPacker, RefusesHostInputWithAClearError) {
  REQUIRE_CUDA();
  std::vector<float> host(1000, 1.0f);
  PackInput in;
  in.data = host.data();
  in.tensors = {PackTensor{0, 1000}};
  in.chunk_elems = 256;
  in.write_packets = false;
  auto packer = CreatePacker({PackerOptions::Device::kCuda});
  ASSERT_TRUE(packer.ok());
  PackOutput out;
  absl::Status s = (*packer)->Pack(in, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

}  // namespace
}  // namespace dlcp
