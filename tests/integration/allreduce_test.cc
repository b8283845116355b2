// End-to-end all-reduce through the real client, gRPC control and data plane, in one process.
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <future>
#include <map>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/wire/header.h"
#include "server/jobs/job_registry.h"
#include "tests/common/ipv6_loopback.h"
#include "tests/integration/test_aggregator.h"
#include "common/transport/factory.h"
#include "common/transport/transport_options.h"

namespace dlcp::testing {
namespace {

struct Case {
  TransportOptions::Kind kind;
  int aggregators;
  int data_threads;
  int workers;
  uint32_t elems;
  double drop;
  uint32_t chunk_bytes = 4096;
  bool data_auth = true;
  wire::Encoding encoding = wire::Encoding::kF32;
  bool ipv6 = false;  // over ::1, the workers' data plane left at its default (IPv4) wildcard
};

std::string Name(const Case& c) {
  return absl::StrCat(TransportKindName(c.kind), "_a", c.aggregators, "t",
                      c.data_threads, "_w", c.workers, "_n", c.elems, "_drop", static_cast<int>(c.drop * 100),
                      c.data_auth ? "" : "_noauth",
                      c.encoding == wire::Encoding::kF32 ? "" : absl::StrCat("_", wire::EncodingName(c.encoding)),
                      c.ipv6 ? "_ipv6" : "");
}

void PrintTo(const Case& c, std::ostream* os) { *os << Name(c); }

// Worker r's element i of tensor t in round k: small integers, so sums are exact.
float Value(int r, int k, int t, uint32_t i) { return static_cast<float>(static_cast<int>((i * 3 + r * 11 + k * 7 + t) % 41) - 20); }

ClientOptions Options(const Case& c, const std::vector<std::string>& aggs, int rank, const std::string& job) {
  ClientOptions o;
  o.aggregators = aggs;
  o.job_name = job;
  o.world_size = c.workers;
  o.rank = rank;
  o.chunk_bytes = c.chunk_bytes;
  o.transport.kind = c.kind;
  o.tls.plaintext = true;
  // An IPv6 job's workers bind the IPv6 wildcard themselves: their aggregators have no IPv4 address.
  // Over RDMA the wildcard takes the port's RoCEv2 GID, and chunks fit its MTU.
  if (!c.ipv6 && c.kind != TransportOptions::Kind::kRdma) o.transport.bind_host = "127.0.0.1";
  if (c.kind == TransportOptions::Kind::kRdma) o.chunk_bytes = 0;
  o.transport.socket_buffer_bytes = 16 << 20;
  o.repair_timeout = absl::Milliseconds(10);
  o.op_timeout = absl::Seconds(30);
  o.loss_bound = 0;  // every chunk must-deliver: the sums must be exact (bounded_loss_test covers ε > 0)
  // Value()s and their sums are small integers, exact in float16 and bfloat16 too.
  o.payload_encoding = c.encoding;
  return o;
}

class AllReduceTest : public ::testing::TestWithParam<Case> {};

TEST_P(AllReduceTest, SumsAreExact) {
  const Case c = GetParam();
  if (c.ipv6 && !HasIpv6Loopback()) GTEST_SKIP() << kNoIpv6;
  // tests/rdma-vm runs the RDMA cases on Soft-RoCE, where none may skip.
  if (c.kind == TransportOptions::Kind::kRdma) {
    TransportOptions probe;
    probe.kind = TransportOptions::Kind::kRdma;
    if (absl::StatusOr<std::unique_ptr<Transport>> t = CreateTransport(probe); !t.ok()) {
      GTEST_SKIP() << "no RDMA device usable here: " << t.status().message();
    }
  }
  std::vector<std::unique_ptr<TestAggregator>> aggs;
  std::vector<std::string> addrs;
  for (int a = 0; a < c.aggregators; ++a) {
    TestAggregatorOptions ao{c.kind, static_cast<uint32_t>(c.data_threads), c.drop, 100u + a};
    ao.limits.data_auth = c.data_auth;
    if (c.ipv6) ao.host = "::1";
    aggs.push_back(TestAggregator::Start(ao));
    ASSERT_NE(aggs.back(), nullptr);
    addrs.push_back(aggs.back()->address());
  }
  constexpr int kRounds = 3, kTensors = 2;
  std::vector<std::string> errors(c.workers);
  std::vector<uint64_t> retransmits(c.workers);
  std::vector<std::thread> threads;
  for (int r = 0; r < c.workers; ++r) {
    threads.emplace_back([&, r] {
      auto client = Client::Connect(Options(c, addrs, r, Name(c)));
      if (!client.ok()) {
        errors[r] = client.status().ToString();
        return;
      }
      for (int k = 0; k < kRounds; ++k) {
        std::vector<std::vector<float>> data(kTensors, std::vector<float>(c.elems));
        std::vector<std::future<absl::StatusOr<RoundStats>>> fs;
        for (int t = 0; t < kTensors; ++t) {
          for (uint32_t i = 0; i < c.elems; ++i) data[t][i] = Value(r, k, t, i);
          fs.push_back((*client)->AllReduce(t, absl::MakeSpan(data[t])));
        }
        for (auto& f : fs) {
          auto s = f.get();
          if (!s.ok()) {
            errors[r] = s.status().ToString();
            return;
          }
          if (s->min_contributors != static_cast<uint32_t>(c.workers)) errors[r] = "contributors short";
          // A reliable tensor of unknown depth rides class 1 whole, whether or not the packer
          // writes its payloads (16-bit encodings) or it goes straight from the tensor.
          if (s->chunks_by_class[1] != s->chunks) {
            errors[r] = absl::StrCat(s->chunks_by_class[1], " of ", s->chunks, " chunks in class 1");
          }
          // Every push carries 2-byte values under a 16-bit encoding (repairs included).
          const uint64_t width = wire::EncodingWidth(c.encoding), chunk_elems = (*client)->chunk_bytes() / 4;
          const uint64_t least = c.elems * width + s->chunks * wire::kHeaderSize;
          const uint64_t most = least + s->retransmits * (wire::kHeaderSize + chunk_elems * width);
          if (s->bytes_sent < least || s->bytes_sent > most) {
            errors[r] = absl::StrCat(s->bytes_sent, " bytes pushed for ", c.elems, " values of ", width,
                                     " bytes, with ", s->retransmits, " repairs");
          }
          retransmits[r] += s->retransmits;
        }
        for (int t = 0; t < kTensors; ++t) {
          for (uint32_t i = 0; i < c.elems; ++i) {
            float want = 0;
            for (int w = 0; w < c.workers; ++w) want += Value(w, k, t, i);
            if (data[t][i] != want) {
              errors[r] = absl::StrCat("round ", k, " tensor ", t, " [", i, "] = ", data[t][i], ", want ", want);
              return;
            }
          }
        }
      }
      if (auto s = (*client)->Close(); !s.ok()) errors[r] = s.ToString();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < c.workers; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  double completed = 0, dropped = 0;
  for (auto& a : aggs) {
    completed += a->Counter("dlcp_rounds_total{outcome=\"completed\"}");
    dropped += a->Counter("dlcp_inject_dropped_total");
  }
  if (c.drop > 0 && c.elems > 10000) {
    EXPECT_GT(dropped, 0) << "drop injection did not fire";
    uint64_t total = 0;
    for (auto v : retransmits) total += v;
    EXPECT_GT(total, 0u) << "losses were repaired without any retransmit?";
  }
  EXPECT_GT(completed, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Matrix, AllReduceTest,
    ::testing::Values(
        Case{TransportOptions::Kind::kLoopback, 1, 1, 1, 1000, 0},
        Case{TransportOptions::Kind::kLoopback, 1, 1, 4, 1, 0},
        Case{TransportOptions::Kind::kLoopback, 2, 2, 4, 100003, 0},
        Case{TransportOptions::Kind::kLoopback, 2, 1, 3, 65536, 0.1},
        Case{TransportOptions::Kind::kUdp, 1, 1, 2, 1000, 0},
        Case{TransportOptions::Kind::kUdp, 1, 1, 4, 1023 * 64 + 5, 0},
        Case{TransportOptions::Kind::kUdp, 2, 1, 4, 250000, 0},
        Case{TransportOptions::Kind::kUdp, 2, 2, 4, 100003, 0.1},
        Case{TransportOptions::Kind::kUdp, 3, 1, 2, 300001, 0.05},
        Case{TransportOptions::Kind::kUdp, 2, 1, 4, 100003, 0.05, 4096, /*data_auth=*/false},
        Case{TransportOptions::Kind::kLoopback, 2, 2, 4, 100003, 0, 4096, true, wire::Encoding::kF16},
        Case{TransportOptions::Kind::kLoopback, 1, 1, 3, 5, 0, 4096, true, wire::Encoding::kBF16},
        Case{TransportOptions::Kind::kUdp, 2, 1, 4, 250000, 0, 4096, true, wire::Encoding::kBF16},
        Case{TransportOptions::Kind::kUdp, 2, 2, 3, 100003, 0.1, 4096, true, wire::Encoding::kF16},
        Case{TransportOptions::Kind::kUdp, 2, 2, 4, 250000, 0, 4096, true, wire::Encoding::kF32, /*ipv6=*/true},
        Case{TransportOptions::Kind::kUdp, 2, 1, 3, 100003, 0.1, 4096, true, wire::Encoding::kF32, /*ipv6=*/true},
        Case{TransportOptions::Kind::kRdma, 2, 2, 3, 100003, 0},
        Case{TransportOptions::Kind::kRdma, 2, 1, 3, 100003, 0.1},
        Case{TransportOptions::Kind::kRdma, 1, 1, 2, 250000, 0, 0, true, wire::Encoding::kBF16}),
    [](const auto& info) { return Name(info.param); });

// Connects c.workers clients to one aggregator at once (joins wait for each other).
void ConnectAll(TestAggregator& agg, const Case& c, const std::string& job,
                std::vector<std::unique_ptr<Client>>* clients) {
  clients->resize(c.workers);
  std::vector<absl::Status> status(c.workers);
  std::vector<std::thread> joiners;
  for (int r = 0; r < c.workers; ++r) {
    joiners.emplace_back([&, r] {
      auto cl = Client::Connect(Options(c, {agg.address()}, r, job));
      if (cl.ok()) (*clients)[r] = std::move(*cl);
      status[r] = cl.status();
    });
  }
  for (auto& j : joiners) j.join();
  for (auto& s : status) ASSERT_TRUE(s.ok()) << s;
}

// The client is shared by several trainer threads, each with its own tensors; every op of every
// thread must complete exactly.
TEST(AllReduceConcurrency, ManyThreadsShareOneClient) {
  auto agg = TestAggregator::Start({TransportOptions::Kind::kUdp, 2});
  ASSERT_NE(agg, nullptr);
  constexpr int kWorkers = 2, kThreads = 6, kRounds = 8;
  constexpr uint32_t kElems = 30011;
  std::vector<std::unique_ptr<Client>> clients;
  ASSERT_NO_FATAL_FAILURE(ConnectAll(*agg, Case{TransportOptions::Kind::kUdp, 1, 2, kWorkers, kElems, 0},
                                     "shared-client", &clients));
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorkers; ++r) {
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, r, t] {
        std::vector<float> d(kElems);
        for (int k = 0; k < kRounds; ++k) {
          for (uint32_t i = 0; i < kElems; ++i) d[i] = Value(r, k, t, i);
          auto s = clients[r]->AllReduce(100 + t, absl::MakeSpan(d)).get();
          if (!s.ok() || s->round != static_cast<uint32_t>(k)) {
            ++failures;
            return;
          }
          for (uint32_t i = 0; i < kElems; ++i) {
            if (d[i] != Value(0, k, t, i) + Value(1, k, t, i)) {
              ++failures;
              return;
            }
          }
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  for (auto& c : clients) EXPECT_TRUE(c->Close().ok());
}


// AllReduceAsync: the callback runs once per op, on the I/O thread, and may submit the next round
// of the same key from inside (a pipelined trainer does exactly that); a refused op calls back on
// the caller's thread at once.
TEST(AllReduceAsync, CallbacksChainRoundsOfTheSameKey) {
  auto agg = TestAggregator::Start({TransportOptions::Kind::kUdp, 1});
  ASSERT_NE(agg, nullptr);
  constexpr int kWorkers = 2, kRounds = 12;
  constexpr uint32_t kElems = 5003;
  std::vector<std::unique_ptr<Client>> clients;
  ASSERT_NO_FATAL_FAILURE(ConnectAll(*agg, Case{TransportOptions::Kind::kUdp, 1, 1, kWorkers, kElems, 0},
                                     "async-chain", &clients));

  struct Chain {
    std::vector<float> data = std::vector<float>(kElems);
    int round = 0;
    int bad = 0;
    std::thread::id caller;
    std::promise<void> finished;
  };
  std::vector<Chain> chains(kWorkers);
  std::function<void(int)> submit = [&](int r) {
    Chain& ch = chains[r];
    for (uint32_t i = 0; i < kElems; ++i) ch.data[i] = Value(r, ch.round, 0, i);
    clients[r]->AllReduceAsync(7, absl::MakeSpan(ch.data), {}, [&, r](absl::StatusOr<RoundStats> s) {
      Chain& c = chains[r];
      if (std::this_thread::get_id() == c.caller) ++c.bad;  // must not run on the submitting thread
      if (!s.ok() || s->round != static_cast<uint32_t>(c.round)) ++c.bad;
      for (uint32_t i = 0; s.ok() && i < kElems; ++i) {
        if (c.data[i] != Value(0, c.round, 0, i) + Value(1, c.round, 0, i)) {
          ++c.bad;
          break;
        }
      }
      if (!s.ok() || ++c.round == kRounds) return c.finished.set_value();
      submit(r);  // the next round of the same key, from inside the callback
    });
  };
  for (int r = 0; r < kWorkers; ++r) {
    chains[r].caller = std::this_thread::get_id();
    submit(r);
  }
  for (int r = 0; r < kWorkers; ++r) {
    ASSERT_EQ(chains[r].finished.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
    EXPECT_EQ(chains[r].round, kRounds);
    EXPECT_EQ(chains[r].bad, 0);
  }

  std::thread::id ran_on;
  int calls = 0;
  clients[0]->AllReduceAsync(8, {}, {}, [&](absl::StatusOr<RoundStats> s) {
    ran_on = std::this_thread::get_id();
    ++calls;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  for (auto& c : clients) EXPECT_TRUE(c->Close().ok());
}

// A worker that leaves (its trainer raised and closed the client) while a round still needs its
// data fails the job at once for the others, naming it, rather than at their op deadline.
TEST(AllReduceLeave, AWorkerLeavingMidRoundFailsTheOthersNamingIt) {
  auto agg = TestAggregator::Start({TransportOptions::Kind::kUdp, 1});
  ASSERT_NE(agg, nullptr);
  std::vector<std::unique_ptr<Client>> clients;
  ASSERT_NO_FATAL_FAILURE(ConnectAll(*agg, Case{TransportOptions::Kind::kUdp, 1, 1, 3, 1000, 0}, "leaver", &clients));
  std::vector<std::vector<float>> data(3, std::vector<float>(1000, 1.0f));
  std::vector<std::future<absl::StatusOr<RoundStats>>> first;
  for (int r = 0; r < 3; ++r) first.push_back(clients[r]->AllReduce(1, absl::MakeSpan(data[r])));
  for (auto& f : first) ASSERT_TRUE(f.get().ok());  // a whole round: leaving after it harms nobody
  EXPECT_TRUE(clients[2]->Close().ok());
  auto pending0 = clients[0]->AllReduce(1, absl::MakeSpan(data[0]));
  auto pending1 = clients[1]->AllReduce(1, absl::MakeSpan(data[1]));
  for (auto* f : {&pending0, &pending1}) {
    ASSERT_EQ(f->wait_for(std::chrono::seconds(10)), std::future_status::ready);
    absl::StatusOr<RoundStats> s = f->get();
    EXPECT_EQ(s.status().code(), absl::StatusCode::kAborted) << s.status();
    EXPECT_NE(s.status().message().find("worker rank 2 left the job"), std::string::npos) << s.status();
    // The aggregator is named as the worker was told to reach it, not by the data port it sent from.
    EXPECT_NE(s.status().message().find("aggregator " + agg->address() + ": "), std::string::npos) << s.status();
  }
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(clients[r]->Close().ok());
}

// Two or more workers on one aggregator, connected at once (each Connect waits for the others).
std::vector<std::unique_ptr<Client>> ConnectAll(int workers, const std::function<ClientOptions(int)>& options) {
  std::vector<std::unique_ptr<Client>> clients(workers);
  std::vector<std::thread> joiners;
  std::vector<absl::Status> status(workers);
  for (int r = 0; r < workers; ++r) {
    joiners.emplace_back([&, r] {
      auto cl = Client::Connect(options(r));
      if (cl.ok()) clients[r] = std::move(*cl);
      status[r] = cl.status();
    });
  }
  for (auto& j : joiners) j.join();
  for (auto& s : status) EXPECT_TRUE(s.ok()) << s;
  return clients;
}

// `workers` clients of job `name` on `agg` over `kind`, for rounds of `elems` values, each one's
// options (Options()) then adjusted by `adjust`.
std::vector<std::unique_ptr<Client>> ConnectAll(const TestAggregator& agg, TransportOptions::Kind kind, int workers,
                                                uint32_t elems, const std::string& name,
                                                const std::function<void(int rank, ClientOptions&)>& adjust) {
  return ConnectAll(workers, [&](int r) {
    ClientOptions o = Options(Case{kind, 1, 1, workers, elems, 0}, {agg.address()}, r, name);
    adjust(r, o);
    return o;
  });
}

// Round k of key 1 over every client: each worker's Value()s, summed exactly into every buffer.
// Returns each worker's stats; a failed op or a wrong sum is a test failure (and an empty result).
std::vector<RoundStats> ExactRoundOf(const std::vector<std::unique_ptr<Client>>& clients, int k, uint32_t elems) {
  const int workers = static_cast<int>(clients.size());
  std::vector<std::vector<float>> data(workers, std::vector<float>(elems));
  std::vector<std::future<absl::StatusOr<RoundStats>>> fs;
  for (int r = 0; r < workers; ++r) {
    for (uint32_t i = 0; i < elems; ++i) data[r][i] = Value(r, k, 0, i);
    fs.push_back(clients[r]->AllReduce(1, absl::MakeSpan(data[r])));
  }
  std::vector<RoundStats> stats;
  for (auto& f : fs) {
    absl::StatusOr<RoundStats> s = f.get();
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) stats.push_back(*s);
  }
  for (int r = 0; r < workers; ++r) {
    for (uint32_t i = 0; i < elems; ++i) {
      float sum = 0;
      for (int w = 0; w < workers; ++w) sum += Value(w, k, 0, i);
      if (data[r][i] != sum) {
        ADD_FAILURE() << "round " << k << " rank " << r << " element " << i << ": " << data[r][i] << " != " << sum;
        return {};
      }
    }
  }
  return stats.size() == clients.size() ? stats : std::vector<RoundStats>{};
}

// Runs `rounds` exact rounds, none of which may wait for a 3 s repair timeout; returns the
// retransmits of them all.
uint64_t ExactRoundsWithoutTimeouts(const std::vector<std::unique_ptr<Client>>& clients, int rounds, uint32_t elems) {
  uint64_t retransmits = 0;
  for (int k = 0; k < rounds; ++k) {
    std::vector<RoundStats> stats = ExactRoundOf(clients, k, elems);
    EXPECT_EQ(stats.size(), clients.size());
    if (stats.size() != clients.size()) break;
    for (const RoundStats& s : stats) {
      EXPECT_LT(s.time, absl::Milliseconds(1500)) << "round " << k << " waited for the 3 s repair timeout";
      retransmits += s.retransmits;
    }
  }
  return retransmits;
}

// The aggregator asks for lost pushes (and probes for lost results) after a quiet spell of the
// round's own pace, not after the configured repair timeout, which is only the ceiling: with a
// 3 s timeout everywhere, rounds that lose packets still finish in a fraction of it.
TEST(AllReduceRepair, LossIsRepairedAtTheRoundsOwnPace) {
  TestAggregatorOptions ao{TransportOptions::Kind::kUdp, 1, /*inject_drop=*/0.05, 7};
  ao.repair_timeout = absl::Seconds(3);
  auto agg = TestAggregator::Start(ao);
  ASSERT_NE(agg, nullptr);
  constexpr int kWorkers = 2, kRounds = 4;
  constexpr uint32_t kElems = 200000;
  auto clients = ConnectAll(*agg, TransportOptions::Kind::kUdp, kWorkers, kElems, "own-pace",
                            [](int, ClientOptions& o) { o.repair_timeout = absl::Seconds(3); });
  if (HasFailure()) return;
  const uint64_t retransmits = ExactRoundsWithoutTimeouts(clients, kRounds, kElems);
  EXPECT_GT(agg->Counter("dlcp_inject_dropped_total"), 0);
  EXPECT_GT(retransmits, 0u);
  for (auto& c : clients) EXPECT_TRUE(c->Close().ok());
}

// Datagrams the kernel drops because a worker's receive buffer is full are loss on that host, not
// on the network: the worker counts them (Client::ReceiveOverflows), apart from what it drops
// itself (Rejects), and its rounds repair what was lost and stay exact. A burst of garbage at a
// buffer that holds about one datagram overflows it; every datagram of the burst is then either
// refused by the worker or counted as dropped by the kernel.
TEST(AllReduceRepair, DatagramsAFullReceiveBufferDroppedAreCountedAndRoundsStayExact) {
  auto agg = TestAggregator::Start(TestAggregatorOptions{TransportOptions::Kind::kUdp, 1, 0, 7});
  ASSERT_NE(agg, nullptr);
  constexpr int kWorkers = 2, kRounds = 3;
  constexpr uint32_t kElems = 200000;
  auto clients = ConnectAll(*agg, TransportOptions::Kind::kUdp, kWorkers, kElems, "rx-overflow",
                            [](int r, ClientOptions& o) {
                              // The kernel doubles it, and queues a datagram past the limit only
                              // into an empty buffer.
                              if (r == 0) o.transport.socket_buffer_bytes = 4096;
                            });
  if (HasFailure()) return;
  const auto job = agg->jobs().Find(server::JobIdForName("rx-overflow"));
  ASSERT_NE(job, nullptr);
  const SockAddr to = job->members[0].address().ToSockaddr();
  const int tx = socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(tx, 0);
  constexpr int kBurst = 2000;
  const std::vector<uint8_t> garbage(1000, 0xAB);  // refused as bad_magic
  for (int i = 0; i < kBurst; ++i) {
    ASSERT_EQ(sendto(tx, garbage.data(), garbage.size(), 0, to.get(), to.len), static_cast<ssize_t>(garbage.size()));
  }
  close(tx);
  // The kernel reports what it dropped with the next datagram it delivers: the rounds' results.
  // Those overflow the buffer too, so the rounds repair results, and results come back exact.
  for (int k = 0; k < kRounds; ++k) ASSERT_EQ(ExactRoundOf(clients, k, kElems).size(), clients.size());
  const uint64_t overflows = clients[0]->ReceiveOverflows();
  const std::map<std::string, uint64_t> rejects = clients[0]->Rejects();
  const uint64_t refused = rejects.count("bad_magic") ? rejects.at("bad_magic") : 0;
  EXPECT_GT(overflows, 0u) << "nothing overflowed: the test needs a smaller buffer or a larger burst";
  EXPECT_LT(refused, static_cast<uint64_t>(kBurst));
  EXPECT_GE(refused + overflows, static_cast<uint64_t>(kBurst)) << refused << " refused, " << overflows << " dropped";
  for (const auto& [reason, count] : rejects) {
    EXPECT_TRUE(reason == "bad_magic" || reason == "unknown_round") << reason << ": " << count;
  }
  // A NIC port's counters are RDMA's: a UDP client has none, and says so with an empty set, not
  // an error.
  absl::StatusOr<std::map<std::string, uint64_t>> port = clients[0]->PortCounters();
  ASSERT_TRUE(port.ok()) << port.status();
  EXPECT_TRUE(port->empty()) << port->begin()->first;
  absl::StatusOr<uint64_t> one = clients[0]->PortCounter("out_of_buffer");
  EXPECT_EQ(one.status().code(), absl::StatusCode::kNotFound) << one.status();
  EXPECT_NE(one.status().message().find("out_of_buffer"), std::string::npos) << one.status();
  for (auto& c : clients) EXPECT_TRUE(c->Close().ok());
  EXPECT_GE(clients[0]->ReceiveOverflows(), overflows) << "still readable after Close";
  EXPECT_TRUE(clients[0]->PortCounters().ok()) << "still readable after Close";
}

// A third of every worker's pushes lost at the aggregator: every endpoint's window fills with
// chunks whose results wait for repairs, this worker's and others'. Repairs go out beyond the
// full window (they ride class 0 and have a window's worth of their own), and the sums stay
// exact without any round waiting for a worker's silence (the 3 s repair timeout). The old rule,
// repairs only into free slots, also passes here (a stuck window is released at the round's
// pace), just slower: 120-200 ms rounds against 40-110 ms on this machine.
TEST(AllReduceRepair, HeavyLossWithFullWindowsIsRepairedAtTheRoundsPace) {
  // Four endpoints: while one endpoint's window is stuck, results from the others keep coming,
  // so the worker is never silent as a whole.
  TestAggregatorOptions ao{TransportOptions::Kind::kUdp, 4, 0, 13};
  ao.inject_class.rate = {0, 0.3, 0, 0};  // a third of every worker's pushes; repairs ride class 0
  auto agg = TestAggregator::Start(ao);
  ASSERT_NE(agg, nullptr);
  constexpr int kWorkers = 3, kRounds = 3;
  constexpr uint32_t kElems = 300000;
  auto clients = ConnectAll(*agg, TransportOptions::Kind::kUdp, kWorkers, kElems, "full-window",
                            [](int, ClientOptions& o) {
                              o.repair_timeout = absl::Seconds(3);
                              o.adaptive_window = true;
                              o.window_bytes = 16 * o.chunk_bytes;
                              o.class_policy.kind = ClassPolicyOptions::Kind::kUniform;
                            });
  if (HasFailure()) return;
  const uint64_t retransmits = ExactRoundsWithoutTimeouts(clients, kRounds, kElems);
  EXPECT_GT(retransmits, 0u);
  for (auto& c : clients) EXPECT_TRUE(c->Close().ok());
}

// Congestion control: pushes lost on the way (injected at the workers, in every class) show up
// as results missing behind later ones, and cut the endpoint's window (every loss taken for
// congestion, congestion_delay_us = 0); sums stay exact, and the fixed window (adaptive_window =
// false) never reports a cut.
struct WindowCase {
  TransportOptions::Kind kind;
  bool adaptive;
};

class AdaptiveWindowTest : public ::testing::TestWithParam<WindowCase> {};

TEST_P(AdaptiveWindowTest, LossCutsTheWindowAndSumsStayExact) {
  const WindowCase wc = GetParam();
  auto agg = TestAggregator::Start(TestAggregatorOptions{wc.kind, 1, 0, 11});
  ASSERT_NE(agg, nullptr);
  constexpr int kWorkers = 2, kRounds = 3;
  constexpr uint32_t kElems = 300000;  // 293 chunks of 4 KiB: well past the reordering slack
  auto clients = ConnectAll(*agg, wc.kind, kWorkers, kElems, wc.adaptive ? "window-adaptive" : "window-fixed",
                            [&](int r, ClientOptions& o) {
                              o.adaptive_window = wc.adaptive;
                              // Every loss cuts: injected drops come with flat round trips, which
                              // read as random loss (random_loss_test covers that).
                              o.congestion_delay_us = 0;
                              o.inject.rate = {0.03, 0.03, 0.03, 0.03};
                              o.inject.seed = 5 + r;
                            });
  if (HasFailure()) return;
  uint64_t cuts = 0, dropped = 0;
  for (int k = 0; k < kRounds; ++k) {
    std::vector<RoundStats> stats = ExactRoundOf(clients, k, kElems);
    ASSERT_EQ(stats.size(), clients.size());
    for (const RoundStats& s : stats) {
      cuts += s.window_cuts;
      dropped += s.injected_drops;
    }
  }
  EXPECT_GT(dropped, 0u);
  if (wc.adaptive) {
    // About 60 pushes lost, some per window: read from the results, that is 8-14 cuts (and 0-1
    // from silences alone, were gaps not read).
    EXPECT_GE(cuts, 3u) << "lost pushes hardly cut the window";
  } else {
    EXPECT_EQ(cuts, 0u);
  }
  for (auto& c : clients) EXPECT_TRUE(c->Close().ok());
}

INSTANTIATE_TEST_SUITE_P(Windows, AdaptiveWindowTest,
                         ::testing::Values(WindowCase{TransportOptions::Kind::kLoopback, true},
                                           WindowCase{TransportOptions::Kind::kUdp, true},
                                           WindowCase{TransportOptions::Kind::kUdp, false}),
                         [](const ::testing::TestParamInfo<WindowCase>& i) {
                           return absl::StrCat(i.param.kind == TransportOptions::Kind::kUdp ? "udp" : "loopback",
                                               i.param.adaptive ? "_adaptive" : "_fixed");
                         });

// A worker whose own pushes all arrive still cuts when another worker's pushes of the same chunks
// are lost in its class: they share the switch port into the aggregator, and that class's queue
// there. Those results come flagged as repaired (wire::kFlagRepaired) with the class of the
// loss, so the cuts stand. A loss in a less important class (a queue strict priority serves
// after this worker's) leaves the result merely late, which undoes the cut, as does a result
// nobody pushed again.
class SharedLossTest : public ::testing::TestWithParam<TransportOptions::Kind> {
 protected:
  struct Cuts {
    uint64_t cuts = 0, undos = 0;
  };
  // Two workers, every chunk of rank 0 in class0 and of rank 1 in class1; only rank 1 loses
  // pushes. Returns rank 0's cuts and undos over 3 rounds.
  Cuts RankZeroCuts(uint8_t class0, uint8_t class1) {
    auto agg = TestAggregator::Start(TestAggregatorOptions{GetParam(), 1, 0, 11});
    EXPECT_NE(agg, nullptr);
    if (agg == nullptr) return {};
    constexpr int kWorkers = 2, kRounds = 3;
    constexpr uint32_t kElems = 300000;
    auto clients = ConnectAll(*agg, GetParam(), kWorkers, kElems, "shared-loss", [&](int r, ClientOptions& o) {
      o.adaptive_window = true;
      // Every loss cuts: the injected drops come with flat round trips, which would read as random
      // loss and cut nothing (delay_signal.h); this test is about whose loss a cut is taken for.
      o.congestion_delay_us = 0;
      o.class_policy.kind = ClassPolicyOptions::Kind::kUniform;
      o.class_policy.uniform_class = r == 0 ? class0 : class1;
      if (r == 1) o.inject.rate = {0.03, 0.03, 0.03, 0.03};  // only rank 1 loses pushes
      o.inject.seed = 9;
    });
    if (HasFailure()) return {};
    Cuts c;
    uint64_t lost_by_1 = 0, lost_by_0 = 0;
    for (int k = 0; k < kRounds; ++k) {
      std::vector<RoundStats> stats = ExactRoundOf(clients, k, kElems);
      EXPECT_EQ(stats.size(), clients.size());
      if (stats.size() != clients.size()) return {};
      c.cuts += stats[0].window_cuts;
      c.undos += stats[0].window_undos;
      lost_by_0 += stats[0].injected_drops;
      lost_by_1 += stats[1].injected_drops;
    }
    EXPECT_EQ(lost_by_0, 0u);
    EXPECT_GT(lost_by_1, 0u);
    for (auto& client : clients) EXPECT_TRUE(client->Close().ok());
    return c;
  }
};

TEST_P(SharedLossTest, AnotherWorkersLossInTheSameClassKeepsTheCut) {
  const Cuts c = RankZeroCuts(1, 1);
  EXPECT_GE(c.cuts, 3u) << "rank 1's losses hardly cut rank 0's window";
  // Before results said so, every one of these cuts was undone once rank 1's repair came in.
  EXPECT_LE(c.undos * 2, c.cuts) << "rank 0 took back cuts that rank 1's losses caused";
}

TEST_P(SharedLossTest, AnotherWorkersLossInALessImportantClassIsOnlyLateness) {
  const Cuts c = RankZeroCuts(1, 3);
  EXPECT_GE(c.cuts, 3u) << "rank 1's late chunks hardly cut rank 0's window";
  EXPECT_GE(c.undos * 2, c.cuts) << "rank 0 kept cuts for losses in a queue its pushes never took";
}

INSTANTIATE_TEST_SUITE_P(Transports, SharedLossTest,
                         ::testing::Values(TransportOptions::Kind::kLoopback, TransportOptions::Kind::kUdp),
                         [](const ::testing::TestParamInfo<TransportOptions::Kind>& i) {
                           return std::string(i.param == TransportOptions::Kind::kUdp ? "udp" : "loopback");
                         });

}  // namespace
}  // namespace dlcp::testing
