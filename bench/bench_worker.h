// One dlcp-bench worker: joins the job, all-reduces integer-valued tensors for a number of
// rounds, checks every element of every result exactly, and reports timings as JSON.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"

namespace dlcp::bench {

struct WorkerConfig {
  ClientOptions client;
  uint64_t tensor_bytes = 4 << 20;
  uint32_t tensors = 1;
  uint32_t rounds = 10;
  uint32_t warmup = 1;
  uint32_t start_delay_ms = 0;
  bool progress = false;
};

struct WorkerResult {
  uint32_t rounds = 0;
  std::vector<double> round_ms;
  double total_s = 0;
  double max_abs_err = 0;
  uint64_t retransmits = 0;
  uint64_t result_requests = 0;
  uint32_t min_contributors = 0;
  bool exact = true;
};

// The value worker `rank` contributes at element i of tensor t in round r. Small integers, so
// any sum of up to 2^18 workers is exact in float32.
inline float BenchValue(uint32_t rank, uint32_t round, uint32_t tensor, uint64_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + rank * 13 + round * 5 + tensor * 3) % 61) - 30);
}

inline constexpr uint32_t kBarrierKey = 0xFFFFFFFFu;

absl::StatusOr<WorkerResult> RunWorker(const WorkerConfig& config);

double Percentile(std::vector<double> v, double q);
std::string ResultJson(const WorkerConfig& config, const WorkerResult& r);

}  // namespace dlcp::bench
