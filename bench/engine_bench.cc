// The reduction engine against a STREAM-style add (c = a + b), both in one binary and one run.
// Both move 12 bytes per element (two reads, one write). Prints Google Benchmark's table, then a
// JSON line and a ratio table: engine bytes/s over STREAM-add bytes/s at each size.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "common/wire/mac.h"
#include "common/reduce/sum.h"

namespace {

// Compiled with the same instruction-set clones as the engine, so the comparison is like for like.
__attribute__((target_clones("avx512f", "avx2", "default"), noinline)) void StreamAdd(
    float* __restrict c, const float* __restrict a, const float* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) c[i] = a[i] + b[i];
}

void BM_EngineSumInto(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0)) / sizeof(float);
  std::vector<float> dst(n, 1.0f), src(n, 2.0f);
  for (auto _ : state) {
    dlcp::reduce::SumInto(dst.data(), src.data(), n);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * n * 12);
}

void BM_StreamAdd(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0)) / sizeof(float);
  std::vector<float> a(n, 1.0f), b(n, 2.0f), c(n);
  for (auto _ : state) {
    StreamAdd(c.data(), a.data(), b.data(), n);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * n * 12);
}

// The data-plane MAC over one chunk (header + payload), the per-packet cost of authentication.
void BM_PacketMac(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> header(48, 1), payload(n, 2), tag(8);
  dlcp::wire::MacKey key = {1, 2, 3, 4};
  for (auto _ : state) {
    dlcp::wire::ComputeMac(key, header.data(), payload.data(), n, tag.data());
    benchmark::DoNotOptimize(tag.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * n);
}
BENCHMARK(BM_PacketMac)->Arg(8 << 10)->Arg(64 << 10);

// 8 KiB and 64 KiB: one chunk, cache resident (the hot path). 64 MiB: main memory.
BENCHMARK(BM_EngineSumInto)->Arg(8 << 10)->Arg(64 << 10)->Arg(64 << 20);
BENCHMARK(BM_StreamAdd)->Arg(8 << 10)->Arg(64 << 10)->Arg(64 << 20);

class Collector : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      std::string name = r.benchmark_name();
      auto slash = name.find('/');
      rates_[std::stol(name.substr(slash + 1))][name.substr(0, slash)] = r.counters.at("bytes_per_second");
    }
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<long, std::map<std::string, double>> rates_;  // by size in bytes
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  Collector collector;
  benchmark::RunSpecifiedBenchmarks(&collector);
  std::printf("\n| size bytes | engine GB/s | stream add GB/s | engine/stream |\n|---|---|---|---|\n");
  std::string json = "{\"engine_vs_stream\":[";
  bool first = true;
  for (const auto& [size, r] : collector.rates_) {
    if (r.count("BM_PacketMac")) {
      std::printf("| %ld | MAC (HighwayHash) %.2f GB/s | | |\n", size, r.at("BM_PacketMac") / 1e9);
    }
    double e = r.count("BM_EngineSumInto") ? r.at("BM_EngineSumInto") : 0;
    double s = r.count("BM_StreamAdd") ? r.at("BM_StreamAdd") : 0;
    if (s <= 0) continue;
    std::printf("| %ld | %.2f | %.2f | %.2f |\n", size, e / 1e9, s / 1e9, e / s);
    char item[256];
    std::snprintf(item, sizeof(item), "%s{\"bytes\":%s,\"engine_gbps\":%.3f,\"stream_gbps\":%.3f,\"ratio\":%.3f}",
                  first ? "" : ",", std::to_string(size).c_str(), e / 1e9, s / 1e9, e / s);
    json += item;
    first = false;
  }
  std::printf("%s]}\n", json.c_str());
  return 0;
}
