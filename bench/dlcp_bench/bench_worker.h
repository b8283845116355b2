// One dlcp-bench worker: joins the job, all-reduces integer-valued tensors for a number of
// rounds, checks every element of every result exactly, and reports timings as JSON.
#pragma once

#include <array>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/dlcp_bench/round_values.h"
#include "client/client.h"

namespace dlcp::bench {

struct WorkerConfig {
  ClientOptions client;
  uint64_t tensor_bytes = 4 << 20;
  uint32_t tensors = 1;
  uint32_t rounds = 10;
  uint32_t warmup = 1;
  // Past `rounds`, more rounds until this long since the first timed one (soak and rotation
  // runs); the workers agree on when to stop.
  absl::Duration min_duration = absl::ZeroDuration();
  uint32_t start_delay_ms = 0;
  // Each round, this long between the workers' start barrier and this worker's push: a worker
  // slowed on purpose, whose computation takes longer than its peers'.
  uint32_t step_delay_ms = 0;
  bool progress = false;
  // Run a round again when the job failed (ABORTED: a worker was lost), as a trainer that waits
  // for the restarted worker would. Every round then uses the same data, so a worker that
  // restarts (from round 0) and the others agree on what the sums must be.
  bool retry_aborted = false;
  // ... for at most this long per round, from its first failure: a worker whose peers have
  // finished (or never come back) fails then, naming the setting.
  absl::Duration retry_aborted_for = absl::Seconds(120);
};

struct WorkerResult {
  uint32_t rounds = 0;
  std::vector<double> round_ms;
  double total_s = 0;
  double max_abs_err = 0;
  uint64_t retransmits = 0;
  uint64_t result_requests = 0;
  uint64_t window_cuts = 0;
  uint64_t window_undos = 0;
  uint64_t losses_tolerated = 0;
  uint64_t nacks_deferred = 0;
  uint32_t min_contributors = 0;
  // The longest time from one timed round's end to the next's, barriers and checks between them
  // included: where a stall that hits the barrier (a 1-element all-reduce) shows.
  double max_gap_ms = 0;
  // Gaps over 100 ms (the first 64): when each ended (Unix seconds) and how long it was (ms), so a
  // script can tell which event a stall followed.
  std::vector<std::pair<double, double>> long_gaps;
  bool exact = true;
  // false: bounded loss with more workers than the digit check can decode, or with a 16-bit
  // encoding; a 16-bit encoding whose sums cannot be exact.
  bool checked = true;
  // Bounded loss, over every round.
  std::array<uint64_t, 4> chunks_by_class = {};
  std::array<uint64_t, 4> left_out_by_class = {};
  uint64_t bound_violations = 0;
  double max_round_loss = 0;  // the largest fraction of droppable contributions missing in a round
  std::vector<double> stop_ms;
  std::vector<double> tail_ms;  // per bounded round: the longest tail wait of its shards
  uint64_t pull_missing = 0;  // bounded pull: result chunks given up on
  uint32_t retried = 0;       // rounds run again (retry_aborted)
  // The job's slowest rank as the last round's RoundStats named it (-1: none yet), and its lateness.
  int32_t slowest_rank = -1;
  double slowest_lateness_ms = 0;
  // The size of the host stage its ops went through at the end (Client::host_stage), 0: none.
  uint32_t host_stage_size = 0;
  // Packets the client dropped (Client::Rejects): late copies of results its rounds no longer
  // needed (unknown_round), and every other reason.
  uint64_t stale = 0;
  uint64_t rejected = 0;
  uint64_t rx_overflows = 0;  // results the kernel dropped for a full receive buffer (Client::ReceiveOverflows)
  uint64_t rx_queue_ran_dry = 0;  // times the RDMA receive queue ran dry (Client::ReceiveQueueRanDry)
  // How much each of the NIC port's counters (Client::PortCounters) grew while the worker ran, as
  // a JSON object: {} over UDP. The port's, so every process on it adds to them.
  std::string port_counters = "{}";
};

inline constexpr uint32_t kBarrierKey = 0xFFFFFFFFu;

absl::StatusOr<WorkerResult> RunWorker(const WorkerConfig& config);
// {"name":growth,...} of every counter in `after`; {} if either read failed.
std::string PortCounterGrowth(const absl::StatusOr<std::map<std::string, uint64_t>>& before,
                              const absl::StatusOr<std::map<std::string, uint64_t>>& after);

double Percentile(std::vector<double> v, double q);
std::string ResultJson(const WorkerConfig& config, const WorkerResult& r);

}  // namespace dlcp::bench
