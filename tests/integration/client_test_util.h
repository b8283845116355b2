// Clients for the integration tests that drive a TestAggregator with real clients and sockets of
// their own (client_errors_test, data_plane_validation_test).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "client/client.h"
#include "common/transport/factory.h"
#include "common/transport/transport.h"

namespace dlcp::testing {

inline ClientOptions Opts(const std::string& agg, const std::string& job, uint32_t world = 1, uint32_t rank = 0) {
  ClientOptions o;
  o.aggregators = {agg};
  o.job_name = job;
  o.world_size = world;
  o.rank = rank;
  o.chunk_bytes = 1024;
  o.tls.plaintext = true;
  o.transport.bind_host = "127.0.0.1";
  o.rpc_timeout = absl::Seconds(2);
  o.op_timeout = absl::Seconds(5);
  o.repair_timeout = absl::Milliseconds(10);
  o.loss_bound = 0;  // these tests check exact sums under floods and replays: nothing droppable
  return o;
}

// Connects ranks 0..n-1 of `job` at once (Connect waits for the whole world); a rank that could
// not connect stays null.
inline std::vector<std::unique_ptr<Client>> ConnectAll(const std::string& agg, const std::string& job, int n) {
  std::vector<std::unique_ptr<Client>> clients(n);
  std::vector<std::thread> joins;
  for (int r = 0; r < n; ++r) {
    joins.emplace_back([&, r] {
      if (auto c = Client::Connect(Opts(agg, job, n, r)); c.ok()) clients[r] = std::move(*c);
    });
  }
  for (auto& j : joins) j.join();
  return clients;
}

// Two workers of one job: a round of key 3 (500 floats, 2 chunks of 1 KiB) where they put in a
// and b, returning what rank 0 got at element 499 and rank 1 at element 0.
inline std::pair<float, float> TwoWorkerRound(std::vector<std::unique_ptr<Client>>& clients, float a, float b) {
  std::vector<float> d0(500, a), d1(500, b);
  auto f0 = clients[0]->AllReduce(3, absl::MakeSpan(d0));
  auto f1 = clients[1]->AllReduce(3, absl::MakeSpan(d1));
  EXPECT_TRUE(f0.get().ok());
  EXPECT_TRUE(f1.get().ok());
  return std::make_pair(d0[499], d1[0]);
}

// A socket of the test's own on 127.0.0.1.
inline std::unique_ptr<Transport> TestSocket() {
  TransportOptions t;
  t.bind_host = "127.0.0.1";
  auto tx = CreateTransport(t);
  EXPECT_TRUE(tx.ok()) << tx.status();
  return tx.ok() ? std::move(*tx) : nullptr;
}

}  // namespace dlcp::testing
