// Gloo all-reduce baseline (Debian's libgloo-dev, TCP on loopback), measured the way
// dlcp-bench measures dlcp: a barrier before each iteration, the slowest rank's time per
// iteration, every element checked. Forks --workers ranks; prints one JSON line.
// On a test bed of separate hosts (bench/netbed_compare.sh), each host runs one rank with
//   --rank R --store DIR --host ADDR     (DIR: a directory every rank can see)
// and afterwards `--summarize --store DIR` prints the JSON line from the ranks' times.
// --algorithm ring (the default; system gloo_ring_tcp) or halving_doubling (Gloo's
// AllreduceHalvingDoubling, built once and run each iteration as a framework reuses a bucket's;
// system gloo_hd_tcp), the better of Gloo's two for many ranks of small tensors.
#include <gloo/allreduce.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace {

struct Args {
  int workers = 2;
  size_t bytes = 4 << 20;
  int iters = 10;
  int warmup = 2;
  int rank = -1;
  std::string store;
  std::string host = "127.0.0.1";
  std::string algorithm = "ring";
  bool summarize = false;
  const char* system() const { return algorithm == "ring" ? "gloo_ring_tcp" : "gloo_hd_tcp"; }
};

float Value(int rank, int iter, size_t i) { return static_cast<float>(static_cast<int>((i * 7 + rank * 13 + iter * 5) % 61) - 30); }

int RunRank(const Args& a, int rank, const std::string& dir) {
  gloo::transport::tcp::attr attr;
  attr.hostname = a.host;
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore fs(dir);
  gloo::rendezvous::PrefixStore store("bench", fs);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, a.workers);
  ctx->setTimeout(std::chrono::seconds(120));
  ctx->connectFullMesh(store, dev);
  const size_t n = a.bytes / sizeof(float);
  std::vector<float> buf(n);
  std::vector<double> ms;
  bool exact = true;
  std::unique_ptr<gloo::Algorithm> halving_doubling;
  if (a.algorithm == "halving_doubling") {
    halving_doubling = std::make_unique<gloo::AllreduceHalvingDoubling<float>>(ctx, std::vector<float*>{buf.data()}, n);
  }
  for (int it = 0; it < a.warmup + a.iters; ++it) {
    for (size_t i = 0; i < n; ++i) buf[i] = Value(rank, it, i);
    gloo::BarrierOptions bo(ctx);
    bo.setTag(1000000 + it);
    gloo::barrier(bo);
    auto t0 = std::chrono::steady_clock::now();
    if (halving_doubling) {
      halving_doubling->run();
    } else {
      gloo::AllreduceOptions opts(ctx);
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      opts.setOutput(buf.data(), n);
      opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setTag(it);
      gloo::allreduce(opts);
    }
    auto t1 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < n; ++i) {
      float want = 0;
      for (int r = 0; r < a.workers; ++r) want += Value(r, it, i);
      if (buf[i] != want) exact = false;
    }
    if (it >= a.warmup) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::ofstream(dir + "/times." + std::to_string(rank)) << (exact ? 1 : 0) << "\n";
  {
    std::ofstream f(dir + "/times." + std::to_string(rank), std::ios::app);
    for (double v : ms) f << v << "\n";
  }
  gloo::BarrierOptions done(ctx);
  done.setTag(2000000);
  gloo::barrier(done);
  return exact ? 0 : 1;
}

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  size_t idx = static_cast<size_t>(std::ceil(q * v.size())) - 1;
  return v[std::min(idx, v.size() - 1)];
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--summarize") {
      a.summarize = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "gloo_allreduce: %s needs a value\n", k.c_str());
      return 2;
    }
    if (k == "--workers") a.workers = std::atoi(argv[i + 1]);
    else if (k == "--tensor-bytes") a.bytes = std::strtoull(argv[i + 1], nullptr, 10);
    else if (k == "--rounds") a.iters = std::atoi(argv[i + 1]);
    else if (k == "--warmup") a.warmup = std::atoi(argv[i + 1]);
    else if (k == "--rank") a.rank = std::atoi(argv[i + 1]);
    else if (k == "--store") a.store = argv[i + 1];
    else if (k == "--host") a.host = argv[i + 1];
    else if (k == "--algorithm") a.algorithm = argv[i + 1];
    else {
      std::fprintf(stderr, "usage: gloo_allreduce [--workers N] [--tensor-bytes B] [--rounds R] [--warmup W] "
                           "[--algorithm ring|halving_doubling]\n");
      return 2;
    }
  }
  if (a.algorithm != "ring" && a.algorithm != "halving_doubling") {
    std::fprintf(stderr, "gloo_allreduce: --algorithm is ring or halving_doubling, not %s\n", a.algorithm.c_str());
    return 2;
  }
  if (a.workers < 1 || a.iters < 1 || a.bytes < 4) {
    std::fprintf(stderr, "gloo_allreduce: bad arguments\n");
    return 2;
  }
  if (a.rank >= 0) {
    if (a.store.empty() || a.rank >= a.workers) {
      std::fprintf(stderr, "gloo_allreduce: --rank needs --store and a rank below --workers\n");
      return 2;
    }
    return RunRank(a, a.rank, a.store);
  }
  bool ok = true;
  std::string dir = a.store;
  if (!a.summarize) {
    char tmpl[] = "/tmp/gloo_allreduce.XXXXXX";
    if (!mkdtemp(tmpl)) return 1;
    dir = tmpl;
    std::vector<pid_t> kids;
    for (int r = 0; r < a.workers; ++r) {
      pid_t p = fork();
      if (p == 0) _exit(RunRank(a, r, dir));
      kids.push_back(p);
    }
    for (pid_t p : kids) {
      int st = 0;
      waitpid(p, &st, 0);
      ok = ok && WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
  }
  // The slowest rank's time per iteration, as for dlcp.
  std::vector<double> slowest(a.iters, 0);
  for (int r = 0; r < a.workers && ok; ++r) {
    std::ifstream f(dir + "/times." + std::to_string(r));
    int exact = 0;
    f >> exact;
    ok = ok && f.good() && exact == 1;
    for (int i = 0; i < a.iters; ++i) {
      double v = 0;
      f >> v;
      slowest[i] = std::max(slowest[i], v);
    }
  }
  std::string cleanup = "rm -rf '" + dir + "'";
  if (!a.summarize && std::system(cleanup.c_str()) != 0) std::fprintf(stderr, "warning: could not remove %s\n", dir.c_str());
  double p50 = Percentile(slowest, 0.5);
  std::printf(
      "{\"system\":\"%s\",\"workers\":%d,\"tensor_bytes\":%zu,\"rounds\":%d,\"p50_ms\":%.3f,\"p99_ms\":%.3f,"
      "\"goodput_gbps\":%.3f,\"exact\":%s}\n",
      a.system(), a.workers, a.bytes, a.iters, p50, Percentile(slowest, 0.99), a.bytes * 8.0 / (p50 / 1e3) / 1e9,
      ok ? "true" : "false");
  return ok ? 0 : 1;
}
