#include "bench/bench_worker.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace dlcp::bench {

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t idx = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size()))) - 1;
  return v[std::min(idx, v.size() - 1)];
}

namespace {
void Progress(uint32_t done, uint32_t total) {
  const int width = 40;
  static int last_filled = -1;
  int filled = static_cast<int>(static_cast<double>(done) / total * width);
  if (filled == last_filled && done != total) return;
  last_filled = filled;
  std::string bar = absl::StrCat("\r[", std::string(filled, '#'), std::string(width - filled, ' '), "] ", done, "/",
                                 total, " rounds");
  if (done == total) bar += "\n";
  ssize_t unused = ::write(STDERR_FILENO, bar.data(), bar.size());
  (void)unused;
}
}  // namespace

absl::StatusOr<WorkerResult> RunWorker(const WorkerConfig& config) {
  if (config.start_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(config.start_delay_ms));
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(config.client);
  if (!client.ok()) return client.status();
  const uint32_t rank = config.client.rank;
  const uint32_t world = config.client.world_size;
  const uint64_t elems = config.tensor_bytes / sizeof(float);
  if (elems == 0) return absl::InvalidArgumentError("tensor-bytes must be at least 4");
  std::vector<std::vector<float>> data(config.tensors, std::vector<float>(elems));

  WorkerResult result;
  result.min_contributors = UINT32_MAX;
  const uint32_t total_rounds = config.warmup + config.rounds;
  for (uint32_t round = 0; round < total_rounds; ++round) {
    for (uint32_t t = 0; t < config.tensors; ++t) {
      for (uint64_t i = 0; i < elems; ++i) data[t][i] = BenchValue(rank, round, t, i);
    }
    // A one-element all-reduce is a barrier: the timed region starts with every worker ready, so
    // it measures the all-reduce and not a peer still checking the last round.
    float token = 1;
    absl::StatusOr<RoundStats> barrier = (*client)->AllReduce(kBarrierKey, absl::MakeSpan(&token, 1)).get();
    if (!barrier.ok()) return barrier.status();
    // Its repairs are traffic the job sent too, and the metrics test balances them.
    result.retransmits += barrier->retransmits;
    result.result_requests += barrier->result_requests;
    if (token != static_cast<float>(world)) {
      return absl::InternalError(absl::StrCat("barrier summed to ", token, ", expected ", world));
    }
    const absl::Time start = absl::Now();
    std::vector<std::future<absl::StatusOr<RoundStats>>> futures;
    for (uint32_t t = 0; t < config.tensors; ++t) futures.push_back((*client)->AllReduce(t, absl::MakeSpan(data[t])));
    for (auto& f : futures) {
      absl::StatusOr<RoundStats> stats = f.get();  // each op completes by its own deadline
      if (!stats.ok()) return stats.status();
      result.retransmits += stats->retransmits;
      result.result_requests += stats->result_requests;
      result.min_contributors = std::min(result.min_contributors, stats->min_contributors);
    }
    const double ms = absl::ToDoubleMilliseconds(absl::Now() - start);
    for (uint32_t t = 0; t < config.tensors; ++t) {
      for (uint64_t i = 0; i < elems; ++i) {
        float expected = 0;
        for (uint32_t r = 0; r < world; ++r) expected += BenchValue(r, round, t, i);
        double err = std::fabs(static_cast<double>(data[t][i]) - expected);
        if (err != 0) {
          if (result.exact) {
            std::fprintf(stderr, "rank %u: round %u tensor %u element %llu is %g, expected %g\n", rank, round, t,
                         static_cast<unsigned long long>(i), data[t][i], expected);
          }
          result.exact = false;
          result.max_abs_err = std::max(result.max_abs_err, err);
        }
      }
    }
    if (round >= config.warmup) {
      result.round_ms.push_back(ms);
      result.total_s += ms / 1000.0;
      ++result.rounds;
    }
    if (config.progress) Progress(round + 1, total_rounds);
  }
  if (absl::Status s = (*client)->Close(); !s.ok()) return s;
  return result;
}

std::string ResultJson(const WorkerConfig& config, const WorkerResult& r) {
  const double bytes = static_cast<double>(config.tensor_bytes) * config.tensors * r.rounds;
  const double goodput = r.total_s > 0 ? bytes * 8 / r.total_s / 1e9 : 0;
  return absl::StrFormat(
      "{\"rank\":%u,\"workers\":%u,\"aggregators\":%u,\"tensor_bytes\":%u,\"tensors\":%u,\"rounds\":%u,"
      "\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"mean_ms\":%.3f,\"goodput_gbps\":%.3f,\"max_abs_err\":%g,"
      "\"retransmits\":%u,\"result_requests\":%u,\"min_contributors\":%u,\"exact\":%s}",
      config.client.rank, config.client.world_size, config.client.aggregators.size(), config.tensor_bytes,
      config.tensors, r.rounds, Percentile(r.round_ms, 0.5), Percentile(r.round_ms, 0.99),
      r.rounds ? r.total_s * 1000 / r.rounds : 0.0, goodput, r.max_abs_err, r.retransmits, r.result_requests,
      r.min_contributors == UINT32_MAX ? 0 : r.min_contributors, r.exact ? "true" : "false");
}

}  // namespace dlcp::bench
