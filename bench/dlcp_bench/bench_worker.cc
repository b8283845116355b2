#include "bench/dlcp_bench/bench_worker.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/base/clock.h"

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

absl::Status CheckPartialSums(absl::Span<const float> got, const wire::ChunkGeometry& g,
                              absl::Span<const uint8_t> my_classes, uint32_t rank, uint32_t world,
                              uint64_t reported_missing, uint64_t pull_missing, const RoundValues& values) {
  uint64_t missing = 0, empty = 0;
  for (uint32_t c = 0; c < g.chunk_count(); ++c) {
    // The subset of workers in this chunk, read off its first element's base-16 digits.
    const uint64_t first = g.offset(c);
    const uint32_t whole = static_cast<uint32_t>(got[first]);
    uint32_t subset = 0;
    for (uint32_t r = 0; r < world; ++r) {
      if ((whole >> (4 * r) & 15) != 0) subset |= 1u << r;
    }
    const std::vector<float> want = values.Sum(subset);
    if (uint64_t k = values.FirstMismatch(want, first, got.subspan(first, g.elems(c))); k < g.elems(c)) {
      const uint64_t i = first + k;
      return absl::DataLossError(absl::StrCat("element ", i, " is ", got[i], ", not the sum ",
                                              want[i % values.period()],
                                              " of the contributions of worker set 0x", absl::Hex(subset)));
    }
    if (my_classes[c] == 0 && !(subset >> rank & 1)) {
      return absl::DataLossError(absl::StrCat("chunk ", c, " is class 0 here but lacks this worker's contribution"));
    }
    if (subset == 0) {
      ++empty;  // every contribution lost, or (bounded pull) the result given up on and zeroed
    } else {
      missing += world - static_cast<uint32_t>(__builtin_popcount(subset));
    }
  }
  if (empty < pull_missing) {
    return absl::DataLossError(absl::StrCat(pull_missing, " results reported given up on, but only ", empty,
                                            " chunks are zero"));
  }
  // Chunks given up on hide how many contributions they had; the rest must add up exactly.
  missing += (empty - pull_missing) * world;
  if (pull_missing == 0 ? missing != reported_missing : missing > reported_missing) {
    return absl::DataLossError(absl::StrCat(missing, " contributions are missing from the results, but the "
                                            "aggregators' STOPs reported ", reported_missing));
  }
  return absl::OkStatus();
}

namespace {
// One worker's run: its client, its tensors and what it measured. Each round fills the tensors,
// waits at a barrier, all-reduces them (timed), waits again, and checks every element.
// `count` zeroed tensors of `elems` floats, each made in place: a copied prototype would hold
// a second tensor's memory while they are made.
std::vector<std::vector<float>> Tensors(uint32_t count, uint64_t elems) {
  std::vector<std::vector<float>> out(count);
  for (std::vector<float>& t : out) t.resize(elems);
  return out;
}

class WorkerRun {
 public:
  WorkerRun(const WorkerConfig& config, std::unique_ptr<Client> client)
      : config_(config),
        client_(std::move(client)),
        elems_(config.tensor_bytes / sizeof(float)),
        data_(Tensors(config.tensors, elems_)),
        classes_(config.tensors),
        geometry_{static_cast<uint32_t>(elems_), client_->chunk_bytes() / 4} {
    result_.min_contributors = UINT32_MAX;
    const uint32_t world = config.client.world_size;
    // A 16-bit encoding rounds the digit values, and bfloat16 keeps BenchValue's sums (|sum| <=
    // 30 per worker) exact only up to 256, float16 up to 2048.
    const wire::Encoding encoding = config.client.payload_encoding;
    const bool wide = encoding == wire::Encoding::kF32;
    digits_ = bounded() && world <= kMaxDigitWorkers && wide;
    const uint32_t exact_sum = encoding == wire::Encoding::kBF16 ? 256 : 2048;
    result_.checked = bounded() ? digits_ : (wide || 30 * world <= exact_sum);
  }

  absl::StatusOr<WorkerResult> Run();

 private:
  // What one round's ops reported, per tensor, for the checks after it.
  struct RoundReport {
    std::vector<uint64_t> reported_missing, pull_missing;
    double stop_ms = 0;
    double tail_ms = 0;
  };
  bool bounded() const { return config_.client.loss_bound > 0; }
  RoundValues ValuesOf(uint32_t round, uint32_t t) const {
    return RoundValues(digits_, config_.client.world_size, config_.retry_aborted ? 0 : round, t);
  }
  // Runs round `round`; its status, or whether --min-seconds wants more rounds (in `more`).
  absl::Status RunRound(uint32_t round, uint32_t total_rounds, bool* more);
  absl::StatusOr<RoundReport> AllReduceAll();
  void Count(const RoundStats& stats);
  absl::StatusOr<bool> Barrier(bool enough);
  void CheckDigits(uint32_t round, const RoundReport& report);
  void CheckSums(uint32_t round);
  void Time(uint32_t round, double ms);
  // OK to run the round again after `s` (retry_aborted, within retry_aborted_for, after a pause
  // that doubles from 100 ms to 2 s); else what to fail with.
  absl::Status Retry(uint32_t round, const absl::Status& s);

  const WorkerConfig& config_;
  std::unique_ptr<Client> client_;
  const uint64_t elems_;
  std::vector<std::vector<float>> data_;
  // The class the client gave each chunk (RoundStats::classes), to check that no class-0 chunk
  // was left out.
  std::vector<std::vector<uint8_t>> classes_;
  const wire::ChunkGeometry geometry_;
  bool digits_ = false;
  WorkerResult result_;
  absl::Time timed_start_ = absl::InfiniteFuture();  // of the first timed round
  absl::Time last_end_ = absl::InfinitePast();        // of the last timed round
  // The round being run again, since when, how often, and the pause before the next try.
  uint32_t retrying_round_ = UINT32_MAX;
  absl::Time retrying_since_;
  uint32_t tries_ = 0;
  absl::Duration pause_;
};

absl::StatusOr<WorkerResult> WorkerRun::Run() {
  const absl::StatusOr<std::map<std::string, uint64_t>> port_before = client_->PortCounters();
  const uint32_t total_rounds = config_.warmup + config_.rounds;
  bool more = true;  // past --rounds: whether --min-seconds asks for more
  for (uint32_t round = 0; round < total_rounds || more; ++round) {
    if (round == config_.warmup && timed_start_ == absl::InfiniteFuture()) timed_start_ = MonotonicNow();
    if (absl::Status s = RunRound(round, total_rounds, &more); !s.ok()) {
      if (absl::Status stop = Retry(round, s); !stop.ok()) return stop;
      --round;
      continue;
    }
    if (config_.progress) Progress(round + 1, std::max(total_rounds, round + 1));
  }
  for (const auto& [reason, count] : client_->Rejects()) {
    (reason == "unknown_round" ? result_.stale : result_.rejected) += count;
  }
  result_.rx_overflows = client_->ReceiveOverflows();
  result_.rx_queue_ran_dry = client_->ReceiveQueueRanDry();
  result_.port_counters = PortCounterGrowth(port_before, client_->PortCounters());
  const HostStageInfo stage = client_->host_stage();
  result_.host_stage_size = stage.formed ? stage.local_size : 0;
  if (absl::Status s = client_->Close(); !s.ok()) return s;
  return result_;
}

absl::Status WorkerRun::RunRound(uint32_t round, uint32_t total_rounds, bool* more) {
  for (uint32_t t = 0; t < config_.tensors; ++t) {
    ValuesOf(round, t).Fill(config_.client.rank, 0, absl::MakeSpan(data_[t]));
    classes_[t].clear();
  }
  // The timed region starts with every worker ready, so it measures the all-reduce and not a
  // peer still checking the last round.
  if (absl::StatusOr<bool> b = Barrier(false); !b.ok()) return b.status();
  if (config_.step_delay_ms > 0) absl::SleepFor(absl::Milliseconds(config_.step_delay_ms));
  const absl::Time start = MonotonicNow();
  absl::StatusOr<RoundReport> report = AllReduceAll();
  if (!report.ok()) return report.status();
  const double ms = absl::ToDoubleMilliseconds(MonotonicNow() - start);
  if (bounded() && round >= config_.warmup) {
    result_.stop_ms.push_back(report->stop_ms);
    result_.tail_ms.push_back(report->tail_ms);
  }
  // And no worker checks its results (a pass over its tensors) before every worker's round has
  // ended: on a shared host those checks took CPU from the peers still timed, 4% of a bounded
  // round on the 2-core test bed.
  const bool enough = round + 1 >= total_rounds && MonotonicNow() - timed_start_ >= config_.min_duration;
  absl::StatusOr<bool> any_enough = Barrier(enough);
  if (!any_enough.ok()) return any_enough.status();
  *more = !*any_enough;
  if (digits_) CheckDigits(round, *report);
  if (!bounded() && result_.checked) CheckSums(round);
  Time(round, ms);
  return absl::OkStatus();
}

absl::StatusOr<WorkerRun::RoundReport> WorkerRun::AllReduceAll() {
  AllReduceOptions op_options;
  op_options.report_classes = digits_;
  std::vector<std::future<absl::StatusOr<RoundStats>>> futures;
  for (uint32_t t = 0; t < config_.tensors; ++t) {
    futures.push_back(client_->AllReduce(t, absl::MakeSpan(data_[t]), op_options));
  }
  RoundReport report;
  report.reported_missing.resize(config_.tensors);
  report.pull_missing.resize(config_.tensors);
  absl::Status failed;
  for (uint32_t t = 0; t < config_.tensors; ++t) {
    absl::StatusOr<RoundStats> stats = futures[t].get();  // each op completes by its own deadline
    if (!stats.ok()) {
      if (failed.ok()) failed = stats.status();
      continue;  // the others still use their buffers until they end
    }
    Count(*stats);
    report.reported_missing[t] = stats->droppable_missing;
    report.pull_missing[t] = stats->pull_missing;
    report.stop_ms = std::max(report.stop_ms, absl::ToDoubleMilliseconds(stats->time_to_stop));
    report.tail_ms = std::max(report.tail_ms, absl::ToDoubleMilliseconds(stats->tail_wait));
    classes_[t] = std::move(stats->classes);
  }
  if (!failed.ok()) return failed;
  return report;
}

void WorkerRun::Count(const RoundStats& stats) {
  result_.retransmits += stats.retransmits;
  result_.result_requests += stats.result_requests;
  result_.window_cuts += stats.window_cuts;
  result_.window_undos += stats.window_undos;
  result_.losses_tolerated += stats.losses_tolerated;
  result_.nacks_deferred += stats.nacks_deferred;
  result_.min_contributors = std::min(result_.min_contributors, stats.min_contributors);
  for (int c = 0; c < 4; ++c) {
    result_.chunks_by_class[c] += stats.chunks_by_class[c];
    result_.left_out_by_class[c] += stats.left_out_by_class[c];
  }
  result_.bound_violations += stats.bound_violations;
  result_.pull_missing += stats.pull_missing;
  result_.slowest_rank = stats.slowest_rank;
  result_.slowest_lateness_ms = absl::ToDoubleMilliseconds(stats.slowest_lateness);
  if (stats.droppable_total > 0) {
    const double loss = static_cast<double>(stats.droppable_missing) / stats.droppable_total;
    result_.max_round_loss = std::max(result_.max_round_loss, loss);
    // The tensor-wide bound, on top of each aggregator's own check.
    if (stats.droppable_missing > static_cast<uint64_t>(stats.loss_bound * stats.droppable_total + 1e-9)) {
      ++result_.bound_violations;
    }
  }
}

// A one-element all-reduce is a barrier. Each worker puts in 1, or 2 to say it has run long
// enough (--min-seconds): every worker sees the same sum, so all agree whether any has, and the
// job ends after the same round everywhere. Returns whether any had.
absl::StatusOr<bool> WorkerRun::Barrier(bool enough) {
  const uint32_t world = config_.client.world_size;
  float token = enough ? 2 : 1;
  AllReduceOptions barrier;
  barrier.name = "barrier";  // on the timeline
  absl::StatusOr<RoundStats> b = client_->AllReduce(kBarrierKey, absl::MakeSpan(&token, 1), barrier).get();
  if (!b.ok()) return b.status();
  // Its repairs are traffic the job sent too, and the metrics test balances them.
  result_.retransmits += b->retransmits;
  result_.result_requests += b->result_requests;
  if (token < static_cast<float>(world) || token > static_cast<float>(2 * world) || token != std::floor(token)) {
    return absl::InternalError(absl::StrCat("barrier summed to ", token, ", expected ", world, " to ", 2 * world));
  }
  return token > static_cast<float>(world);
}

void WorkerRun::CheckDigits(uint32_t round, const RoundReport& report) {
  for (uint32_t t = 0; t < config_.tensors; ++t) {
    absl::Status s = classes_[t].size() == geometry_.chunk_count()
                         ? CheckPartialSums(data_[t], geometry_, classes_[t], config_.client.rank,
                                            config_.client.world_size, report.reported_missing[t],
                                            report.pull_missing[t], ValuesOf(round, t))
                         : absl::InternalError(absl::StrCat("the client reported the classes of ", classes_[t].size(),
                                                            " of ", geometry_.chunk_count(), " chunks"));
    if (!s.ok()) {
      if (result_.exact) {
        std::fprintf(stderr, "rank %u: round %u tensor %u: %s\n", config_.client.rank, round, t, s.ToString().c_str());
      }
      result_.exact = false;
    }
  }
}

void WorkerRun::CheckSums(uint32_t round) {
  for (uint32_t t = 0; t < config_.tensors; ++t) {
    const RoundValues values = ValuesOf(round, t);
    const std::vector<float> sum = values.SumAll();
    const absl::Span<const float> got(data_[t]);
    for (uint64_t i = values.FirstMismatch(sum, 0, got); i < elems_;
         i += 1 + values.FirstMismatch(sum, i + 1, got.subspan(i + 1))) {
      const float expected = sum[i % values.period()];
      if (result_.exact) {
        std::fprintf(stderr, "rank %u: round %u tensor %u element %llu is %g, expected %g\n", config_.client.rank,
                     round, t, static_cast<unsigned long long>(i), data_[t][i], expected);
      }
      result_.exact = false;
      result_.max_abs_err = std::max(result_.max_abs_err, std::fabs(static_cast<double>(data_[t][i]) - expected));
    }
  }
}

void WorkerRun::Time(uint32_t round, double ms) {
  if (round < config_.warmup) return;
  const absl::Time end = MonotonicNow();
  if (last_end_ != absl::InfinitePast()) {
    const double gap = absl::ToDoubleMilliseconds(end - last_end_);
    result_.max_gap_ms = std::max(result_.max_gap_ms, gap);
    if (gap > 100 && result_.long_gaps.size() < 64) {
      // When, in wall-clock time: bench scripts set it beside their own `date` stamps.
      result_.long_gaps.emplace_back(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()), gap);
    }
  }
  last_end_ = end;
  result_.round_ms.push_back(ms);
  result_.total_s += ms / 1000.0;
  ++result_.rounds;
}

absl::Status WorkerRun::Retry(uint32_t round, const absl::Status& s) {
  if (!config_.retry_aborted || s.code() != absl::StatusCode::kAborted) return s;
  const absl::Time now = MonotonicNow();
  if (round != retrying_round_) {
    retrying_round_ = round;
    retrying_since_ = now;
    tries_ = 0;
    pause_ = absl::Milliseconds(100);
  }
  if (now - retrying_since_ >= config_.retry_aborted_for) {
    return absl::Status(s.code(), absl::StrCat("rank ", config_.client.rank, " gave round ", round, " up after running it ",
                                               tries_, " more times in ", absl::StrFormat("%.1f s", absl::ToDoubleSeconds(now - retrying_since_)),
                                               " (dlcp-bench --retry-aborted-s=",
                                               absl::ToInt64Seconds(config_.retry_aborted_for), "): ", s.message()));
  }
  std::fprintf(stderr, "rank %u: round %u: %s; running it again\n", config_.client.rank, round, s.ToString().c_str());
  ++result_.retried;
  ++tries_;
  std::this_thread::sleep_for(absl::ToChronoMilliseconds(pause_));
  pause_ = std::min(pause_ * 2, absl::Seconds(2));
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<WorkerResult> RunWorker(const WorkerConfig& config) {
  if (config.start_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(config.start_delay_ms));
  if (config.tensor_bytes / sizeof(float) == 0) return absl::InvalidArgumentError("tensor-bytes must be at least 4");
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(config.client);
  if (!client.ok()) return client.status();
  return WorkerRun(config, std::move(*client)).Run();
}

std::string PortCounterGrowth(const absl::StatusOr<std::map<std::string, uint64_t>>& before,
                              const absl::StatusOr<std::map<std::string, uint64_t>>& after) {
  if (!before.ok() || !after.ok()) return "{}";
  std::string out;
  for (const auto& [name, value] : *after) {
    const auto was = before->find(name);
    // A counter the driver reset (or one that appeared) counts from 0.
    const uint64_t base = was != before->end() && was->second <= value ? was->second : 0;
    absl::StrAppendFormat(&out, "%s\"%s\":%u", out.empty() ? "" : ",", name, value - base);
  }
  return absl::StrCat("{", out, "}");
}

std::string ResultJson(const WorkerConfig& config, const WorkerResult& r) {
  const double bytes = static_cast<double>(config.tensor_bytes) * config.tensors * r.rounds;
  const double goodput = r.total_s > 0 ? bytes * 8 / r.total_s / 1e9 : 0;
  return absl::StrFormat(
      "{\"rank\":%u,\"workers\":%u,\"aggregators\":%u,\"tensor_bytes\":%u,\"tensors\":%u,\"rounds\":%u,"
      "\"p50_ms\":%.3f,\"p99_ms\":%.3f,\"max_ms\":%.3f,\"max_gap_ms\":%.3f,\"mean_ms\":%.3f,\"goodput_gbps\":%.3f,\"max_abs_err\":%g,"
      "\"retransmits\":%u,\"result_requests\":%u,\"min_contributors\":%u,\"exact\":%s,\"checked\":%s,"
      "\"chunks_c0\":%u,\"chunks_c1\":%u,\"chunks_c2\":%u,\"chunks_c3\":%u,\"left_out_c0\":%u,\"left_out_c1\":%u,"
      "\"left_out_c2\":%u,\"left_out_c3\":%u,\"bound_violations\":%u,\"max_round_loss\":%.6f,"
      "\"stop_p99_ms\":%.3f,\"tail_wait_p50_ms\":%.3f,\"tail_wait_p99_ms\":%.3f,\"pull_missing\":%u,\"retried\":%u,\"window_cuts\":%u,\"window_undos\":%u,\"losses_tolerated\":%u,"
      "\"nacks_deferred\":%u,\"rejected\":%u,\"stale\":%u,\"rx_overflows\":%u,\"rx_queue_ran_dry\":%u,\"slowest_rank\":%d,\"slowest_lateness_ms\":%.3f,\"host_stage_size\":%u,\"port_counters\":%s,\"long_gaps\":[%s],\"round_ms\":[%s]}",
      config.client.rank, config.client.world_size, config.client.aggregators.size(), config.tensor_bytes,
      config.tensors, r.rounds, Percentile(r.round_ms, 0.5), Percentile(r.round_ms, 0.99), Percentile(r.round_ms, 1.0),
      r.max_gap_ms, r.rounds ? r.total_s * 1000 / r.rounds : 0.0, goodput, r.max_abs_err, r.retransmits, r.result_requests,
      r.min_contributors == UINT32_MAX ? 0 : r.min_contributors, r.exact ? "true" : "false",
      r.checked ? "true" : "false", r.chunks_by_class[0], r.chunks_by_class[1], r.chunks_by_class[2],
      r.chunks_by_class[3], r.left_out_by_class[0], r.left_out_by_class[1], r.left_out_by_class[2],
      r.left_out_by_class[3], r.bound_violations, r.max_round_loss, Percentile(r.stop_ms, 0.99),
      Percentile(r.tail_ms, 0.5), Percentile(r.tail_ms, 0.99), r.pull_missing,
      r.retried, r.window_cuts, r.window_undos, r.losses_tolerated, r.nacks_deferred, r.rejected, r.stale, r.rx_overflows, r.rx_queue_ran_dry,
      r.slowest_rank, r.slowest_lateness_ms, r.host_stage_size, r.port_counters, absl::StrJoin(r.long_gaps, ",", [](std::string* out, const std::pair<double, double>& g) {
        absl::StrAppendFormat(out, "[%.3f,%.1f]", g.first, g.second);
      }),
      // Every timed round, in order: scripts pool them across workers and runs (a job's round
      // ends with its slowest worker's).
      absl::StrJoin(r.round_ms, ",", [](std::string* out, double ms) { absl::StrAppendFormat(out, "%.3f", ms); }));
}

}  // namespace dlcp::bench
