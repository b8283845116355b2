// dlcp-bench: all-reduce benchmark and end-to-end checker.
//   One worker:   dlcp-bench --aggregators=H:P,... --workers=4 --rank=2 --job=J
//   N workers:    dlcp-bench --aggregators=H:P,... --workers=4      (spawns ranks 0..3 locally)
// The last line of stdout is one JSON object. Exit status 0 only if every result was exact.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "bench/dlcp_bench/bench_worker.h"
#include "client/options/client_flags.h"
#include "common/base/log.h"
#include "common/config/registry.h"

namespace dlcp::bench {
namespace {

// The client options dlcp-bench sets itself: the job's shape comes from --workers and --rank (which
// spawns the ranks), and each result is checked digit by digit, which needs the plain sum of the
// round's data (zero-fill, no error feedback).
const ClientFlagsOptions& BenchClientFlags() {
  static const ClientFlagsOptions* flags = new ClientFlagsOptions{
      .own = {"world_size", "rank", "compensation", "error_feedback"},
      .defaults = {{"aggregators", "127.0.0.1:7400"}, {"job", ""}},
  };
  return *flags;
}

void DeclareFlags(ConfigRegistry* c) {
  DeclareClientFlags(c, BenchClientFlags());  // every other client option, as in docs/configuration.md
  c->AddInt("workers", 1, 1, 4096, "workers in the job");
  c->AddInt("rank", -1, -1, 4095, "this worker's rank; -1 spawns all --workers ranks as child processes");
  // An op holds at most 2^32 - 1 elements (the wire format counts them in 32 bits).
  c->AddInt("tensor-bytes", 4 << 20, 4, int64_t{4} * 0xffffffff, "bytes of float32 per tensor");
  c->AddInt("tensors", 1, 1, 4096, "tensors all-reduced concurrently each round");
  c->AddInt("rounds", 10, 1, 10000000, "timed rounds");
  c->AddInt("warmup", 1, 0, 1000, "untimed rounds first");
  c->AddInt("min-seconds", 0, 0, 86400, "past --rounds, go on until this many seconds of timed rounds have passed");
  c->AddInt("timeout-s", 600, 1, 86400, "spawn mode: kill the workers after this long");
  c->AddInt("late-rank", -1, -1, 4095, "spawn mode: this rank starts late (tests late joins)");
  c->AddInt("late-ms", 0, 0, 600000, "spawn mode: how late --late-rank starts");
  c->AddInt("start-delay-ms", 0, 0, 600000, "sleep this long before joining");
  c->AddInt("step-delay-ms", 0, 0, 600000, "each round, sleep this long before pushing (a slow worker)");
  c->AddInt("slow-rank", -1, -1, 4095, "spawn mode: this rank sleeps --slow-ms each round before pushing");
  c->AddInt("slow-ms", 0, 0, 600000, "spawn mode: how long --slow-rank sleeps each round");
  c->AddBool("progress", false, "rank 0 draws a progress bar on stderr");
  c->AddBool("retry-aborted", false,
             "run a round again when the job lost a worker, until it is back (every round then uses the same data)");
  c->AddInt("retry-aborted-s", 120, 1, 86400, "--retry-aborted gives a round up after running it again this long");
  c->AddBool("json", false, "print only the JSON line (no table)");
  c->AddString("log-level", "warning", "debug, info, warning or error", [](const std::string& v) {
    LogLevel unused;
    return ParseLogLevel(v, &unused);
  });
}

WorkerConfig ConfigFrom(const ConfigRegistry& c) {
  WorkerConfig w;
  // Validated as flags; nothing is left to fail here.
  ClientOptionsFromFlags(c, BenchClientFlags(), &w.client).IgnoreError();
  w.client.world_size = static_cast<uint32_t>(c.GetInt("workers"));
  w.client.rank = static_cast<uint32_t>(std::max<int64_t>(0, c.GetInt("rank")));
  // A worker given --data-host and no --bind-host binds where it is told results go.
  if (!w.client.data_host.empty() && c.GetString("bind-host") == ClientOptions{}.transport.bind_host) {
    w.client.transport.bind_host = w.client.data_host;
  }
  w.client.inject.seed += w.client.rank;  // each rank drops its own packets
  w.client.compensation = ClientOptions::Compensation::kZeroFill;
  w.client.error_feedback = false;
  w.tensor_bytes = static_cast<uint64_t>(c.GetInt("tensor-bytes"));
  w.tensors = static_cast<uint32_t>(c.GetInt("tensors"));
  w.rounds = static_cast<uint32_t>(c.GetInt("rounds"));
  w.warmup = static_cast<uint32_t>(c.GetInt("warmup"));
  w.min_duration = absl::Seconds(c.GetInt("min-seconds"));
  w.start_delay_ms = static_cast<uint32_t>(c.GetInt("start-delay-ms"));
  w.step_delay_ms = static_cast<uint32_t>(c.GetInt("step-delay-ms"));
  w.progress = c.GetBool("progress") && w.client.rank == 0;
  w.retry_aborted = c.GetBool("retry-aborted");
  w.retry_aborted_for = absl::Seconds(c.GetInt("retry-aborted-s"));
  return w;
}

double JsonNumber(const std::string& line, const std::string& key) {
  size_t at = line.find("\"" + key + "\":");
  if (at == std::string::npos) return NAN;
  double v = NAN;
  std::string rest = line.substr(at + key.size() + 3);
  size_t end = rest.find_first_of(",}");
  if (!absl::SimpleAtod(rest.substr(0, end), &v)) return NAN;
  return v;
}

bool JsonTrue(const std::string& line, const std::string& key) {
  return line.find("\"" + key + "\":true") != std::string::npos;
}

struct Child {
  pid_t pid;
  int out;  // the read end of its stdout; -1 once closed
  std::string text;
  int status = -1;
};

// Starts one child per rank with this binary, in job `job`, each printing only its JSON line.
bool StartWorkers(int argc, char** argv, const ConfigRegistry& c, const std::string& job, std::vector<Child>* children) {
  const int workers = static_cast<int>(c.GetInt("workers"));
  for (int r = 0; r < workers; ++r) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
      std::perror("pipe2");
      return false;
    }
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      return false;
    }
    if (pid == 0) {
      dup2(fds[1], STDOUT_FILENO);
      std::vector<std::string> args(argv, argv + argc);
      args.push_back(absl::StrCat("--rank=", r));
      args.push_back(absl::StrCat("--job=", job));
      args.push_back("--json");
      if (r == c.GetInt("late-rank")) args.push_back(absl::StrCat("--start-delay-ms=", c.GetInt("late-ms")));
      if (r == c.GetInt("slow-rank")) args.push_back(absl::StrCat("--step-delay-ms=", c.GetInt("slow-ms")));
      std::vector<char*> cargs;
      for (auto& a : args) cargs.push_back(a.data());
      cargs.push_back(nullptr);
      // Every rank runs on this host, as a local launcher (torchrun) would say: a host stage where
      // this host's dlcpd serves one (docs/host-stage.md).
      setenv("LOCAL_WORLD_SIZE", std::to_string(workers).c_str(), /*overwrite=*/0);
      execv("/proc/self/exe", cargs.data());
      std::perror("execv");
      _exit(127);
    }
    close(fds[1]);
    children->push_back({pid, fds[0], ""});
  }
  return true;
}

// Reads the children's output until each closes it, or kills them all at --timeout-s; then reaps
// them. Returns each one's last line ("" if it printed none), and whether all exited 0 with one.
bool CollectWorkers(const ConfigRegistry& c, std::vector<Child>& children, std::vector<std::string>* lines) {
  const absl::Time deadline = absl::Now() + absl::Seconds(c.GetInt("timeout-s"));
  size_t open = children.size();
  while (open > 0) {
    std::vector<pollfd> pfds;
    for (auto& ch : children) pfds.push_back({ch.out, static_cast<short>(ch.out >= 0 ? POLLIN : 0), 0});
    int left_ms = static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
    if (left_ms == 0) {
      std::cerr << "dlcp-bench: workers still running after " << c.GetInt("timeout-s") << " s; killing them\n";
      for (auto& ch : children) kill(ch.pid, SIGKILL);
      break;
    }
    if (poll(pfds.data(), pfds.size(), std::min(left_ms, 1000)) < 0 && errno != EINTR) break;
    for (size_t i = 0; i < children.size(); ++i) {
      if (children[i].out < 0 || !(pfds[i].revents & (POLLIN | POLLHUP))) continue;
      char buf[4096];
      ssize_t n = read(children[i].out, buf, sizeof(buf));
      if (n > 0) {
        children[i].text.append(buf, n);
      } else {
        close(children[i].out);
        children[i].out = -1;
        --open;
      }
    }
  }
  bool ok = true;
  for (auto& ch : children) {
    waitpid(ch.pid, &ch.status, 0);
    std::vector<std::string> ls = absl::StrSplit(ch.text, '\n', absl::SkipWhitespace());
    if (!WIFEXITED(ch.status) || WEXITSTATUS(ch.status) != 0 || ls.empty()) ok = false;
    lines->push_back(ls.empty() ? "" : ls.back());
  }
  return ok;
}

// The job's summary over its workers' JSON lines: the slowest worker's times and goodput, the sum
// of repairs and drops.
struct JobSummary {
  double p50 = 0, p99 = 0, goodput = INFINITY, max_err = 0, retrans = 0, result_req = 0, rounds = INFINITY;
  double cuts = 0, undos = 0, tolerated = 0, chunks[4] = {}, left_out[4] = {}, violations = 0, max_loss = 0, stop_p99 = 0,
         tail_p50 = 0, tail_p99 = 0;
  double pull_missing = 0, rejected = 0, stale = 0, rx_overflows = 0, rx_queue_ran_dry = 0;
  // The slowest rank the first worker's last round named (RoundStats::slowest_rank), -1 if none.
  double slowest_rank = -1, slowest_lateness_ms = 0;
  double staged_workers = 0;  // workers whose ops went through a host stage at the end
  bool exact = true, checked = true;
  // The workers share their host's port: any one's growth is the job's on that host.
  std::string port_counters = "{}";

  void Add(const std::string& l) {
    if (size_t at = l.find("\"port_counters\":{"); at != std::string::npos && port_counters == "{}") {
      at += std::string("\"port_counters\":").size();
      port_counters = l.substr(at, l.find('}', at) + 1 - at);
    }
    if (l.empty() || std::isnan(JsonNumber(l, "p50_ms"))) {
      exact = false;
      return;
    }
    p50 = std::max(p50, JsonNumber(l, "p50_ms"));
    p99 = std::max(p99, JsonNumber(l, "p99_ms"));
    goodput = std::min(goodput, JsonNumber(l, "goodput_gbps"));
    max_err = std::max(max_err, JsonNumber(l, "max_abs_err"));
    retrans += JsonNumber(l, "retransmits");
    result_req += JsonNumber(l, "result_requests");
    cuts += JsonNumber(l, "window_cuts");
    undos += JsonNumber(l, "window_undos");
    tolerated += JsonNumber(l, "losses_tolerated");
    rounds = std::min(rounds, JsonNumber(l, "rounds"));
    exact = exact && JsonTrue(l, "exact");
    checked = checked && JsonTrue(l, "checked");
    for (int k = 0; k < 4; ++k) {
      chunks[k] += JsonNumber(l, absl::StrCat("chunks_c", k));
      left_out[k] += JsonNumber(l, absl::StrCat("left_out_c", k));
    }
    violations += JsonNumber(l, "bound_violations");
    pull_missing += JsonNumber(l, "pull_missing");
    rejected += JsonNumber(l, "rejected");
    stale += JsonNumber(l, "stale");
    rx_overflows += JsonNumber(l, "rx_overflows");
    rx_queue_ran_dry += JsonNumber(l, "rx_queue_ran_dry");
    max_loss = std::max(max_loss, JsonNumber(l, "max_round_loss"));
    stop_p99 = std::max(stop_p99, JsonNumber(l, "stop_p99_ms"));
    tail_p50 = std::max(tail_p50, JsonNumber(l, "tail_wait_p50_ms"));
    tail_p99 = std::max(tail_p99, JsonNumber(l, "tail_wait_p99_ms"));
    staged_workers += JsonNumber(l, "host_stage_size") > 0 ? 1 : 0;
    if (slowest_rank < 0 && JsonNumber(l, "slowest_rank") >= 0) {
      slowest_rank = JsonNumber(l, "slowest_rank");
      slowest_lateness_ms = JsonNumber(l, "slowest_lateness_ms");
    }
  }
  void Finish() {
    if (violations > 0) exact = false;  // the guarantee is part of correctness
    if (!std::isfinite(goodput)) goodput = 0;
    if (!std::isfinite(rounds)) rounds = 0;
  }
  std::string LossByClass() const {
    std::string out;
    for (int k = 0; k < 4; ++k) {
      absl::StrAppend(&out, k ? "," : "", absl::StrFormat("%.6f", chunks[k] > 0 ? left_out[k] / chunks[k] : 0.0));
    }
    return out;
  }
};

int AggregatorCount(const ConfigRegistry& c) {
  return static_cast<int>(std::count(c.GetString("aggregators").begin(), c.GetString("aggregators").end(), ',')) + 1;
}

void PrintSummary(const ConfigRegistry& c, const JobSummary& j, double loss_bound) {
  std::cout << absl::StrFormat(
      "\ndlcp-bench: %d workers x %d aggregators, %d x %s per round, %d rounds\n"
      "  round time   p50 %.2f ms   p99 %.2f ms\n"
      "  goodput      %.3f Gbit/s per worker\n"
      "  repairs      %d chunks pushed again, %d result requests\n"
      "  dropped      %d packets refused by the workers, %d late copies they no longer needed,\n"
      "               %d their kernels dropped for full receive buffers,\n"
      "               their RDMA receive queues ran dry %d time(s)\n",
      static_cast<int>(c.GetInt("workers")), AggregatorCount(c), c.GetInt("tensors"),
      absl::StrCat(c.GetInt("tensor-bytes"), " B"), static_cast<int>(j.rounds), j.p50, j.p99, j.goodput,
      static_cast<int>(j.retrans), static_cast<int>(j.result_req), static_cast<int>(j.rejected),
      static_cast<int>(j.stale), static_cast<int>(j.rx_overflows), static_cast<int>(j.rx_queue_ran_dry));
  if (j.port_counters != "{}") std::cout << "  NIC port     its counters grew by " << j.port_counters << "\n";
  if (j.slowest_rank >= 0) {
    std::cout << absl::StrFormat("  slowest      rank %d, %.2f ms behind the first on average, as the aggregators measure it\n",
                                 static_cast<int>(j.slowest_rank), j.slowest_lateness_ms);
  }
  std::cout << absl::StrFormat("  host stage   %d of %d workers' ops went through one\n", static_cast<int>(j.staged_workers),
                               static_cast<int>(c.GetInt("workers")));
  if (loss_bound > 0) {
    std::cout << absl::StrFormat(
        "  loss bound   ε = %g: worst round lost %.4f of droppable contributions, %d violations\n"
        "  left out     by class [%s], STOP p99 %.2f ms, %d results given up on (bounded pull)\n"
        "  tail wait    from the bound met to STOP: p50 %.2f ms, p99 %.2f ms\n",
        loss_bound, j.max_loss, static_cast<int>(j.violations), j.LossByClass(), j.stop_p99,
        static_cast<int>(j.pull_missing), j.tail_p50, j.tail_p99);
  }
  std::cout << "  results exact: "
            << (!j.exact    ? "NO"
                : j.checked ? "yes"
                            : "unchecked (bounded loss over 6 workers or in 16 bits, or 16-bit sums too large)")
            << "\n";
}

void PrintJson(const ConfigRegistry& c, const JobSummary& j, double loss_bound) {
  std::cout << absl::StrFormat(
      "{\"workers\":%d,\"aggregators\":%d,\"tensor_bytes\":%d,\"tensors\":%d,\"rounds\":%d,\"p50_ms\":%.3f,"
      "\"p99_ms\":%.3f,\"goodput_gbps\":%.3f,\"max_abs_err\":%g,\"retransmits\":%d,\"result_requests\":%d,"
      "\"loss_bound\":%g,\"loss_by_class\":[%s],\"max_round_loss\":%.6f,\"bound_violations\":%d,"
      "\"stop_p99_ms\":%.3f,\"tail_wait_p50_ms\":%.3f,\"tail_wait_p99_ms\":%.3f,\"pull_missing\":%d,\"window_cuts\":%d,\"window_undos\":%d,\"losses_tolerated\":%d,\"client_rejected\":%d,"
      "\"client_stale\":%d,\"client_rx_overflows\":%d,\"client_rx_queue_ran_dry\":%d,"
      "\"client_port_counters\":%s,\"slowest_rank\":%d,\"slowest_lateness_ms\":%.3f,\"staged_workers\":%d,\"checked\":%s,\"exact\":%s}\n",
      static_cast<int>(c.GetInt("workers")), AggregatorCount(c), c.GetInt("tensor-bytes"), c.GetInt("tensors"),
      static_cast<int>(j.rounds), j.p50, j.p99, j.goodput, j.max_err, static_cast<int>(j.retrans),
      static_cast<int>(j.result_req), loss_bound, j.LossByClass(), j.max_loss, static_cast<int>(j.violations),
      j.stop_p99, j.tail_p50, j.tail_p99, static_cast<int>(j.pull_missing), static_cast<int>(j.cuts), static_cast<int>(j.undos), static_cast<int>(j.tolerated),
      static_cast<int>(j.rejected), static_cast<int>(j.stale), static_cast<int>(j.rx_overflows),
      static_cast<int>(j.rx_queue_ran_dry), j.port_counters, static_cast<int>(j.slowest_rank),
      j.slowest_lateness_ms, static_cast<int>(j.staged_workers), j.checked ? "true" : "false", j.exact ? "true" : "false");
}

// Spawns one child per rank with this binary, collects each child's JSON line, and prints the
// job's summary.
int Spawn(int argc, char** argv, const ConfigRegistry& c) {
  std::string job = c.GetString("job").empty() ? absl::StrCat("bench-", getpid(), "-", absl::ToUnixMicros(absl::Now()))
                                               : c.GetString("job");
  std::vector<Child> children;
  if (!StartWorkers(argc, argv, c, job, &children)) return 1;
  std::vector<std::string> lines;
  JobSummary summary;
  summary.exact = CollectWorkers(c, children, &lines);
  for (const std::string& l : lines) summary.Add(l);
  summary.Finish();
  const double loss_bound = ConfigFrom(c).client.loss_bound;
  if (!c.GetBool("json")) PrintSummary(c, summary, loss_bound);
  PrintJson(c, summary, loss_bound);
  return summary.exact ? 0 : 1;
}

// The memory this host has for new work (MemAvailable in /proc/meminfo), or 0 if unknown.
uint64_t AvailableMemoryBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string name;
  uint64_t kib = 0;
  while (meminfo >> name >> kib) {
    if (name == "MemAvailable:") return kib * 1024;
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return 0;
}

// Each worker on this host holds its tensors whole: refuse, naming the settings, a run that
// would not fit in the host's memory rather than let the kernel kill it midway.
absl::Status CheckMemory(const ConfigRegistry& c) {
  const uint64_t processes = c.GetInt("rank") < 0 ? static_cast<uint64_t>(c.GetInt("workers")) : 1;
  const uint64_t need = processes * static_cast<uint64_t>(c.GetInt("tensors")) *
                        static_cast<uint64_t>(c.GetInt("tensor-bytes"));
  const uint64_t available = AvailableMemoryBytes();
  if (available == 0 || need <= available) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "%u worker(s) here x --tensors=%d x --tensor-bytes=%d need %.2f GiB, and this host has %.2f GiB available: "
      "lower --tensor-bytes, --tensors or --workers",
      processes, c.GetInt("tensors"), c.GetInt("tensor-bytes"), static_cast<double>(need) / (1 << 30),
      static_cast<double>(available) / (1 << 30)));
}

int Main(int argc, char** argv) {
  ConfigRegistry config("dlcp-bench", "all-reduce benchmark; checks every result exactly.");
  DeclareFlags(&config);
  if (std::optional<int> exit_code = config.StartMain(argc, argv)) return *exit_code;
  LogOptions log;
  ParseLogLevel(config.GetString("log-level"), &log.min_level).IgnoreError();
  log.component = "dlcp-bench";
  ConfigureLogging(log);
  if (absl::Status s = CheckMemory(config); !s.ok()) {
    std::cerr << "dlcp-bench: " << s.message() << "\n";
    return 2;
  }
  if (config.GetInt("rank") < 0) return Spawn(argc, argv, config);
  WorkerConfig w = ConfigFrom(config);
  if (w.client.rank >= w.client.world_size) {
    std::cerr << "dlcp-bench: --rank must be below --workers\n";
    return 2;
  }
  absl::StatusOr<WorkerResult> r = RunWorker(w);
  if (!r.ok()) {
    std::cerr << "dlcp-bench rank " << w.client.rank << ": " << r.status() << "\n";
    return 1;
  }
  std::cout << ResultJson(w, *r) << "\n";
  return r->exact ? 0 : 1;
}

}  // namespace
}  // namespace dlcp::bench

int main(int argc, char** argv) { return dlcp::bench::Main(argc, argv); }
