// What one timeline event costs the thread that records it (the client engine's I/O thread), with
// the writer thread writing them out to a file meanwhile, as in a job. Prints Google Benchmark's
// table; bench/timeline_cost.sh multiplies it by the events a step records.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/timeline.h"
#include "common/base/clock.h"

namespace {

// An instant with a numeric argument, as the engine records a repair or a NACK.
void BM_TimelineInstant(benchmark::State& state) {
  const std::string path = absl::StrCat("/tmp/dlcp-timeline-bench-", getpid(), ".json");
  // Room for every event of the run, so that each is recorded (none takes the cheaper dropped path).
  auto timeline = dlcp::Timeline::Open(path, 0, size_t{1} << 22);
  if (!timeline.ok()) {
    state.SkipWithError(std::string(timeline.status().message()).c_str());
    return;
  }
  uint64_t id = 0;
  for (auto _ : state) {
    ++id;
    (*timeline)->Instant(id, "repairs", dlcp::MonotonicNow(), absl::StrCat("\"chunks\":", id & 63));
  }
  state.counters["dropped"] = static_cast<double>((*timeline)->dropped());
  timeline->reset();
  std::remove(path.c_str());
}
BENCHMARK(BM_TimelineInstant)->Iterations(2'000'000)->Repetitions(3);

}  // namespace

BENCHMARK_MAIN();
