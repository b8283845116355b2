// AllReduceDevice end to end: tensors in device memory go through the CUDA packer, a real
// aggregator and back to the device, exactly; and through a host stage (docs/host-stage.md),
// copied straight into its pinned shared memory and back. Skipped, saying why, without a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/metrics/registry.h"
#include "common/transport/transport_options.h"
#include "server/host/host_broker.h"
#include "tests/integration/test_aggregator.h"

namespace dlcp::testing {
namespace {

constexpr int kRounds = 3;

// Worker r's element i in round k: small integers, exact in every type and encoding.
float Value(int r, int k, uint64_t i) { return static_cast<float>(static_cast<int>((i * 7 + r * 5 + k) % 31) - 15); }

void Store(ElemType type, float v, uint8_t* at) {
  if (type == ElemType::kF32) return (void)memcpy(at, &v, 4);
  const uint16_t h = type == ElemType::kF16 ? wire::F32ToF16(v) : wire::F32ToBF16(v);
  memcpy(at, &h, 2);
}

float Load(ElemType type, const uint8_t* at) {
  float f;
  if (type == ElemType::kF32) return memcpy(&f, at, 4), f;
  uint16_t h;
  memcpy(&h, at, 2);
  return type == ElemType::kF16 ? wire::F16ToF32(h) : wire::BF16ToF32(h);
}

// One worker: kRounds ops of a device tensor of `elems` elements, each checked exactly against the
// sum over `workers`. Returns what went wrong ("" when nothing), and the last round's stats.
std::string RunWorker(const ClientOptions& o, ElemType type, uint32_t elems, RoundStats* last) {
  auto client = Client::Connect(o);
  if (!client.ok()) return client.status().ToString();
  const size_t width = ElemWidth(type);
  void* device = nullptr;
  if (cudaMalloc(&device, elems * width) != cudaSuccess) return "cudaMalloc";
  std::vector<uint8_t> host(elems * width);
  std::string error;
  for (int k = 0; k < kRounds && error.empty(); ++k) {
    for (uint32_t i = 0; i < elems; ++i) Store(type, Value(static_cast<int>(o.rank), k, i), &host[width * i]);
    cudaMemcpy(device, host.data(), host.size(), cudaMemcpyHostToDevice);
    auto s = (*client)->AllReduceDevice(1, DeviceTensor{device, type, elems, 0}).get();
    if (!s.ok()) {
      error = s.status().ToString();
      break;
    }
    *last = *s;
    cudaMemcpy(host.data(), device, host.size(), cudaMemcpyDeviceToHost);
    for (uint32_t i = 0; i < elems && error.empty(); ++i) {
      float want = 0;
      for (uint32_t w = 0; w < o.world_size; ++w) want += Value(static_cast<int>(w), k, i);
      const float got = Load(type, &host[width * i]);
      if (got != want) error = absl::StrCat("round ", k, " [", i, "] = ", got, ", want ", want);
    }
  }
  cudaFree(device);
  (*client)->Close().IgnoreError();
  return error;
}

ClientOptions Options(const TestAggregator& agg, const std::string& job, uint32_t world, uint32_t rank) {
  ClientOptions o;
  o.aggregators = {agg.address()};
  o.job_name = job;
  o.world_size = world;
  o.rank = rank;
  o.tls.plaintext = true;
  o.transport.bind_host = "127.0.0.1";
  o.loss_bound = 0;  // exact sums
  o.local_size = 1;  // the network path, unless a test says otherwise
  return o;
}

// Runs every rank's worker on a thread of its own; `tweak` adjusts each rank's options.
std::vector<std::string> RunJob(const TestAggregator& agg, const std::string& job, uint32_t world, ElemType type,
                                uint32_t elems, const std::function<void(ClientOptions&)>& tweak,
                                std::vector<RoundStats>* stats) {
  std::vector<std::string> errors(world);
  stats->assign(world, RoundStats{});
  std::vector<std::thread> threads;
  for (uint32_t r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      ClientOptions o = Options(agg, job, world, r);
      tweak(o);
      errors[r] = RunWorker(o, type, elems, &(*stats)[r]);
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

TEST(DeviceAllReduce, SumsAreExactForEveryTypeAndEncoding) {
  if (absl::Status s = CudaPackerAvailable(); !s.ok()) GTEST_SKIP() << s;
  auto agg = TestAggregator::Start({TransportOptions::Kind::kUdp, 2});
  ASSERT_NE(agg, nullptr);
  for (ElemType type : {ElemType::kF32, ElemType::kF16, ElemType::kBF16}) {
    for (wire::Encoding e : {wire::Encoding::kF32, wire::Encoding::kF16, wire::Encoding::kBF16}) {
      SCOPED_TRACE(absl::StrCat("type ", static_cast<int>(type), " encoding ", wire::EncodingName(e)));
      std::vector<RoundStats> stats;
      const auto errors = RunJob(*agg, absl::StrCat("device-", static_cast<int>(type), "-", wire::EncodingName(e)), 2,
                                 type, 100003, [&](ClientOptions& o) { o.payload_encoding = e; }, &stats);
      for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
    }
  }
}

// Ranks 0 and 1 share a host stage; rank 2 is alone on its host. The stage's device tensors are
// copied into its pinned slots and back, 64 KiB at a time (several steps per tensor), and only
// its first worker pushes the host's sum.
TEST(DeviceAllReduce, HostStageSumsDeviceTensorsExactly) {
  if (absl::Status s = CudaPackerAvailable(); !s.ok()) GTEST_SKIP() << s;
  auto agg = TestAggregator::Start({TransportOptions::Kind::kUdp, 2});
  ASSERT_NE(agg, nullptr);
  MetricsRegistry metrics;
  server::HostBrokerOptions bo;
  bo.socket_path = absl::StrCat("/tmp/dlcp-device-stage-", getpid(), ".sock");
  bo.slot_bytes = 64 << 10;
  auto broker = server::HostBroker::Start(bo, &metrics);
  ASSERT_TRUE(broker.ok()) << broker.status();
  for (ElemType type : {ElemType::kF32, ElemType::kF16, ElemType::kBF16}) {
    SCOPED_TRACE(absl::StrCat("type ", static_cast<int>(type)));
    std::vector<RoundStats> stats;
    const auto errors = RunJob(*agg, absl::StrCat("device-stage-", static_cast<int>(type)), 3, type, 100003,
                               [&](ClientOptions& o) {
                                 if (o.rank == 2) return;
                                 o.local_size = 2;
                                 o.host_socket = bo.socket_path;
                               },
                               &stats);
    for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_GT(stats[0].bytes_sent, 0u) << "the stage's first worker pushes the host's sum";
    EXPECT_EQ(stats[1].bytes_sent, 0u) << "the stage's second worker pushed its own tensor";
    EXPECT_EQ(stats[0].min_contributors, 3u);
  }
}

}  // namespace
}  // namespace dlcp::testing
