// Two workers of one job, each its own dlcp::Client on a thread of this process, sum a tensor
// through the aggregator named on the command line, using only the installed headers and
// libdlcp.so. Prints "sum: ok" and exits 0 when every value is exact.
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "client/capi/dlcp.h"
#include "client/client.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: sum HOST:PORT\n");
    return 2;
  }
  constexpr int kWorld = 2;
  constexpr size_t kElems = 300007;  // several chunks, the last one short
  std::vector<std::vector<float>> data(kWorld, std::vector<float>(kElems));
  std::vector<std::string> errors(kWorld);
  std::vector<std::thread> workers;
  for (int rank = 0; rank < kWorld; ++rank) {
    workers.emplace_back([&, rank] {
      dlcp::ClientOptions o;
      o.aggregators = {argv[1]};
      o.job_name = "installed-consumer";
      o.world_size = kWorld;
      o.rank = static_cast<uint32_t>(rank);
      o.tls.plaintext = true;
      o.transport.bind_host = "127.0.0.1";
      o.loss_bound = 0;  // every contribution, so the sum is exact however the two threads run
      auto client = dlcp::Client::Connect(o);
      if (!client.ok()) {
        errors[rank] = client.status().ToString();
        return;
      }
      std::vector<float>& v = data[rank];
      for (size_t i = 0; i < kElems; ++i) v[i] = static_cast<float>((rank + 1) * (i % 1000));
      absl::StatusOr<dlcp::RoundStats> s = (*client)->AllReduce(7, absl::MakeSpan(v)).get();
      if (!s.ok()) errors[rank] = s.status().ToString();
    });
  }
  for (std::thread& t : workers) t.join();
  for (int rank = 0; rank < kWorld; ++rank) {
    if (!errors[rank].empty()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, errors[rank].c_str());
      return 1;
    }
    for (size_t i = 0; i < kElems; ++i) {
      const float want = static_cast<float>(3 * (i % 1000));  // 1x + 2x
      if (data[rank][i] != want) {
        std::fprintf(stderr, "rank %d: element %zu is %g, not %g\n", rank, i, data[rank][i], want);
        return 1;
      }
    }
  }
  std::printf("sum: ok (libdlcp %s)\n", dlcp_version());
  return 0;
}
