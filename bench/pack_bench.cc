// pack_bench: how fast the packers turn gradients into packets, against a plain copy of the same
// bytes measured in the same run (host memcpy for the CPU packer; a device-to-device cudaMemcpy
// for the CUDA packer). Prints one JSON object, then a ratio table.
//
//   pack_bench [--device=cpu|cuda|all] [--mib=N] [--encoding=f32|f16|bf16] [--reps=N]
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/packer/packer.h"
#include "common/base/build_config.h"
#if DLCP_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace dlcp {
namespace {

struct Args {
  std::string device = "all";
  uint64_t mib = 256;
  wire::Encoding encoding = wire::Encoding::kF32;
  int reps = 5;
  uint32_t chunk_elems = 2048;  // 8 KiB chunks, the default for jumbo frames
};

struct Result {
  std::string device;
  double pack_gbps = 0, copy_gbps = 0;  // input bytes per second, GB/s
  double pack_ms = 0, copy_ms = 0;      // medians
};

template <typename F>
double MedianMs(int reps, F&& f) {
  f();  // warm-up: allocations, first-touch, module load
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const absl::Time t0 = absl::Now();
    f();
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

PackInput Input(const Args& a, const void* data, uint64_t elems) {
  PackInput in;
  in.data = data;
  // One tensor per 2^30 elements at most (a tensor's length is 32 bits).
  for (uint64_t off = 0; off < elems; off += 1u << 30) {
    in.tensors.push_back(PackTensor{off, static_cast<uint32_t>(std::min<uint64_t>(1u << 30, elems - off)),
                                    static_cast<uint32_t>(off >> 30), 0, 0, 1});
  }
  in.chunk_elems = a.chunk_elems;
  in.job = 1;
  in.encoding = a.encoding;
  return in;
}

absl::StatusOr<Result> RunCpu(const Args& a, const std::vector<float>& host) {
  auto packer = CreatePacker({PackerOptions::Device::kCpu});
  if (!packer.ok()) return packer.status();
  const PackInput in = Input(a, host.data(), host.size());
  absl::StatusOr<PackLayout> layout = PlanPack(in, {});
  if (!layout.ok()) return layout.status();
  std::vector<uint8_t> packets(layout->packet_bytes());
  std::vector<float> copy(host.size());
  PackOutput out;
  out.packets = packets.data();
  absl::Status status;
  Result r{"cpu"};
  r.pack_ms = MedianMs(a.reps, [&] { status.Update((*packer)->Pack(in, &out)); });
  if (!status.ok()) return status;
  r.copy_ms = MedianMs(a.reps, [&] { std::memcpy(copy.data(), host.data(), host.size() * 4); });
  const double bytes = host.size() * 4.0;
  r.pack_gbps = bytes / r.pack_ms / 1e6;
  r.copy_gbps = bytes / r.copy_ms / 1e6;
  return r;
}

#if DLCP_WITH_CUDA
absl::StatusOr<Result> RunCuda(const Args& a, const std::vector<float>& host) {
  if (absl::Status s = CudaPackerAvailable(); !s.ok()) return s;
  auto packer = CreatePacker({PackerOptions::Device::kCuda});
  if (!packer.ok()) return packer.status();
  const uint64_t bytes = host.size() * 4;
  float* in_dev = nullptr;
  float* copy_dev = nullptr;
  uint8_t* packets = nullptr;
  PackInput in = Input(a, nullptr, host.size());
  absl::StatusOr<PackLayout> layout = PlanPack(Input(a, host.data(), host.size()), {});
  if (!layout.ok()) return layout.status();
  if (cudaMalloc(&in_dev, bytes) != cudaSuccess || cudaMalloc(&copy_dev, bytes) != cudaSuccess ||
      cudaMalloc(&packets, layout->packet_bytes()) != cudaSuccess) {
    return absl::ResourceExhaustedError("cudaMalloc failed");
  }
  cudaMemcpy(in_dev, host.data(), bytes, cudaMemcpyHostToDevice);
  in.data = in_dev;
  PackOutput out;
  out.packets = packets;
  absl::Status status;
  Result r{"cuda"};
  r.pack_ms = MedianMs(a.reps, [&] { status.Update((*packer)->Pack(in, &out)); });
  r.copy_ms = MedianMs(a.reps, [&] {
    cudaMemcpy(copy_dev, in_dev, bytes, cudaMemcpyDeviceToDevice);
    cudaDeviceSynchronize();
  });
  cudaFree(in_dev);
  cudaFree(copy_dev);
  cudaFree(packets);
  if (!status.ok()) return status;
  r.pack_gbps = bytes / r.pack_ms / 1e6;
  r.copy_gbps = bytes / r.copy_ms / 1e6;
  return r;
}
#endif

int Main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      const std::string prefix = absl::StrCat("--", name, "=");
      return arg.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    if (const char* v = value("device")) {
      a.device = v;
    } else if (const char* v = value("mib")) {
      a.mib = std::strtoull(v, nullptr, 10);
    } else if (const char* v = value("reps")) {
      a.reps = std::max(1, std::atoi(v));
    } else if (const char* v = value("encoding")) {
      absl::StatusOr<wire::Encoding> e = wire::ParseEncoding(v);
      if (!e.ok()) {
        std::fprintf(stderr, "pack_bench: %s\n", e.status().ToString().c_str());
        return 2;
      }
      a.encoding = *e;
    } else {
      std::fprintf(stderr, "pack_bench: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (a.mib == 0 || (a.device != "cpu" && a.device != "cuda" && a.device != "all")) {
    std::fprintf(stderr, "pack_bench: --mib must be positive and --device cpu, cuda or all\n");
    return 2;
  }
  std::vector<float> host(a.mib << 18);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0, 1);
  for (float& v : host) v = normal(rng);

  std::vector<Result> results;
  std::string skipped;
  if (a.device != "cuda") {
    absl::StatusOr<Result> r = RunCpu(a, host);
    if (!r.ok()) {
      std::fprintf(stderr, "pack_bench: cpu: %s\n", r.status().ToString().c_str());
      return 1;
    }
    results.push_back(*r);
  }
  if (a.device != "cpu") {
#if DLCP_WITH_CUDA
    absl::StatusOr<Result> r = RunCuda(a, host);
    if (r.ok()) {
      results.push_back(*r);
    } else if (a.device == "cuda") {
      std::fprintf(stderr, "pack_bench: cuda: %s\n", r.status().ToString().c_str());
      return 1;
    } else {
      skipped = std::string(r.status().message());
    }
#else
    skipped = "built without CUDA";
    if (a.device == "cuda") {
      std::fprintf(stderr, "pack_bench: %s\n", skipped.c_str());
      return 1;
    }
#endif
  }
  std::printf("{\"mib\": %llu, \"encoding\": \"%s\", \"chunk_bytes\": %u, \"reps\": %d, \"results\": [",
              static_cast<unsigned long long>(a.mib), wire::EncodingName(a.encoding), a.chunk_elems * 4, a.reps);
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::printf("%s{\"device\": \"%s\", \"pack_ms\": %.3f, \"copy_ms\": %.3f, \"pack_gbps\": %.2f, \"copy_gbps\": %.2f, "
                "\"ratio\": %.3f}",
                i ? ", " : "", r.device.c_str(), r.pack_ms, r.copy_ms, r.pack_gbps, r.copy_gbps, r.pack_gbps / r.copy_gbps);
  }
  std::printf("]%s%s%s}\n", skipped.empty() ? "" : ", \"cuda_skipped\": \"", skipped.c_str(), skipped.empty() ? "" : "\"");
  std::printf("\n| packer | pack GB/s | copy GB/s | pack / copy |\n|---|---|---|---|\n");
  for (const Result& r : results) {
    std::printf("| %s | %.2f | %.2f | %.3f |\n", r.device.c_str(), r.pack_gbps, r.copy_gbps, r.pack_gbps / r.copy_gbps);
  }
  if (!skipped.empty()) std::printf("\ncuda: not run (%s)\n", skipped.c_str());
  return 0;
}

}  // namespace
}  // namespace dlcp

int main(int argc, char** argv) { return dlcp::Main(argc, argv); }
