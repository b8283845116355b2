// AllReduceDevice end to end: tensors in device memory go through the CUDA packer, a real
// aggregator and back to the device, exactly. Skipped, saying why, without a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "tests/integration/test_aggregator.h"
#include "common/transport/transport_options.h"

namespace dlcp::testing {
namespace {

// Worker r's element i in round k: small integers, exact in every type and encoding.
float Value(int r, int k, uint64_t i) { return static_cast<float>(static_cast<int>((i * 7 + r * 5 + k) % 31) - 15); }

void RunJob(ElemType type, wire::Encoding encoding, uint32_t elems) {
  auto agg = TestAggregator::Start({TransportOptions::Kind::kUdp, 2});
  ASSERT_NE(agg, nullptr);
  constexpr int kWorkers = 2, kRounds = 3;
  const std::string job = absl::StrCat("device-", static_cast<int>(type), "-", wire::EncodingName(encoding));
  std::vector<std::string> errors(kWorkers);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorkers; ++r) {
    threads.emplace_back([&, r] {
      ClientOptions o;
      o.aggregators = {agg->address()};
      o.job_name = job;
      o.world_size = kWorkers;
      o.rank = r;
      o.tls.plaintext = true;
      o.transport.bind_host = "127.0.0.1";
      o.loss_bound = 0;  // exact sums
      o.payload_encoding = encoding;
      auto client = Client::Connect(o);
      if (!client.ok()) {
        errors[r] = client.status().ToString();
        return;
      }
      const size_t width = ElemWidth(type);
      void* device = nullptr;
      if (cudaMalloc(&device, elems * width) != cudaSuccess) {
        errors[r] = "cudaMalloc";
        return;
      }
      std::vector<uint8_t> host(elems * width);
      for (int k = 0; k < kRounds && errors[r].empty(); ++k) {
        for (uint32_t i = 0; i < elems; ++i) {
          const float v = Value(r, k, i);
          if (type == ElemType::kF32) {
            memcpy(&host[4 * i], &v, 4);
          } else {
            const uint16_t h = type == ElemType::kF16 ? wire::F32ToF16(v) : wire::F32ToBF16(v);
            memcpy(&host[2 * i], &h, 2);
          }
        }
        cudaMemcpy(device, host.data(), host.size(), cudaMemcpyHostToDevice);
        auto s = (*client)->AllReduceDevice(1, DeviceTensor{device, type, elems, 0}).get();
        if (!s.ok()) {
          errors[r] = s.status().ToString();
          break;
        }
        cudaMemcpy(host.data(), device, host.size(), cudaMemcpyDeviceToHost);
        for (uint32_t i = 0; i < elems; ++i) {
          float want = 0;
          for (int w = 0; w < kWorkers; ++w) want += Value(w, k, i);
          float got;
          if (type == ElemType::kF32) {
            memcpy(&got, &host[4 * i], 4);
          } else {
            uint16_t h;
            memcpy(&h, &host[2 * i], 2);
            got = type == ElemType::kF16 ? wire::F16ToF32(h) : wire::BF16ToF32(h);
          }
          if (got != want) {
            errors[r] = absl::StrCat("round ", k, " [", i, "] = ", got, ", want ", want);
            break;
          }
        }
      }
      cudaFree(device);
      (*client)->Close().IgnoreError();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorkers; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(DeviceAllReduce, SumsAreExactForEveryTypeAndEncoding) {
  if (absl::Status s = CudaPackerAvailable(); !s.ok()) GTEST_SKIP() << s;
  for (ElemType type : {ElemType::kF32, ElemType::kF16, ElemType::kBF16}) {
    for (wire::Encoding e : {wire::Encoding::kF32, wire::Encoding::kF16, wire::Encoding::kBF16}) {
      SCOPED_TRACE(absl::StrCat("type ", static_cast<int>(type), " encoding ", wire::EncodingName(e)));
      RunJob(type, e, 100003);
    }
  }
}

}  // namespace
}  // namespace dlcp::testing
