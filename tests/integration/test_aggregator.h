// An in-process dlcpd for tests: the real JobRegistry, DataPlane and gRPC AggregatorService on
// 127.0.0.1 (or another local address) with ephemeral ports, over either transport.
#pragma once

#include <grpcpp/create_channel.h>
#include <grpcpp/server_builder.h>

#include <chrono>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "common/base/host_port.h"
#include "common/metrics/registry.h"
#include "server/control/aggregator_service.h"
#include "server/data/data_plane.h"
#include "server/jobs/job_registry.h"
#include "common/transport/transport_options.h"

namespace dlcp::testing {

struct TestAggregatorOptions {
  TransportOptions::Kind kind = TransportOptions::Kind::kUdp;
  uint32_t data_threads = 1;
  double inject_drop = 0;
  uint64_t seed = 1;
  server::JobLimits limits;
  DropInjectorOptions inject_class;  // per-class drops at the aggregator
  absl::Duration repair_timeout = absl::Milliseconds(10);
  int control_port = 0;  // 0: any (a restarted aggregator takes its old one)
  std::string host = "127.0.0.1";  // control and data ports' address ("::1": over IPv6)
  size_t block_cache_bytes = size_t{256} << 20;  // DataPlaneOptions::block_cache_bytes
};

class TestAggregator {
 public:
  static std::unique_ptr<TestAggregator> Start(const TestAggregatorOptions& o) {
    auto a = std::unique_ptr<TestAggregator>(new TestAggregator());
    a->jobs_ = std::make_unique<server::JobRegistry>(o.limits);
    a->jobs_->ExportMetrics(&a->metrics_);
    server::DataPlaneOptions d;
    d.transport.kind = o.kind;
    // Over RDMA the wildcard takes the port's RoCEv2 GID; the control port stays on `host`.
    d.transport.bind_host = o.kind == TransportOptions::Kind::kRdma ? "0.0.0.0" : o.host;
    d.transport.socket_buffer_bytes = 16 << 20;
    d.threads = o.data_threads;
    d.inject_drop = o.inject_drop;
    d.inject_seed = o.seed;
    d.inject_class = o.inject_class;
    d.repair_timeout = o.repair_timeout;
    d.block_cache_bytes = o.block_cache_bytes;
    auto plane = server::DataPlane::Create(d, a->jobs_.get(), &a->metrics_);
    if (!plane.ok()) return nullptr;
    a->data_ = std::move(*plane);
    a->service_ = std::make_unique<server::AggregatorService>("test", "", a->jobs_.get(), a->data_.get(), &a->metrics_);
    grpc::ServerBuilder b;
    a->host_ = o.host;
    b.AddListeningPort(JoinHostPort(o.host, o.control_port), grpc::InsecureServerCredentials(), &a->port_);
    b.RegisterService(a->service_.get());
    a->server_ = b.BuildAndStart();
    if (!a->server_ || a->port_ == 0) return nullptr;
    return a;
  }

  ~TestAggregator() {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    data_->Stop();
  }

  std::string address() const { return JoinHostPort(host_, port_); }
  int port() const { return port_; }
  MetricsRegistry& metrics() { return metrics_; }
  server::JobRegistry& jobs() { return *jobs_; }
  server::DataPlane& data() { return *data_; }
  server::AggregatorService& service() { return *service_; }
  double Counter(const std::string& name) {
    auto snap = metrics_.Snapshot();
    return snap.count(name) ? snap[name] : 0;
  }
  // The counter once it has reached `at_least`, or when `timeout` has passed: the data thread
  // counts packets in its own time, later on a loaded machine.
  double WaitForCounter(const std::string& name, double at_least, absl::Duration timeout = absl::Seconds(5)) {
    const absl::Time end = MonotonicNow() + timeout;
    double v = Counter(name);
    while (v < at_least && MonotonicNow() < end) {
      absl::SleepFor(absl::Milliseconds(2));
      v = Counter(name);
    }
    return v;
  }

  // A Join made by hand, as Session would make it for rank `rank` of `job` whose data plane is a
  // socket of the test's own on 127.0.0.1:`data_port`; callers add what else they need.
  static v1::JoinRequest HandJoin(const std::string& job, uint32_t world, uint32_t rank, uint16_t data_port) {
    v1::JoinRequest req;
    req.set_job_name(job);
    req.set_world_size(world);
    req.set_rank(rank);
    req.set_chunk_bytes(1024);
    req.set_data_host("127.0.0.1");
    req.set_data_port(data_port);
    req.set_worker_keys(true);
    return req;
  }
  // Sends `req` to this aggregator's control port, within 5 s.
  grpc::Status Join(const v1::JoinRequest& req, v1::JoinResponse* resp) {
    auto stub = v1::Aggregator::NewStub(grpc::CreateChannel(address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return stub->Join(&ctx, req, resp);
  }

 private:
  TestAggregator() = default;
  MetricsRegistry metrics_;
  std::unique_ptr<server::JobRegistry> jobs_;
  std::unique_ptr<server::DataPlane> data_;
  std::unique_ptr<server::AggregatorService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string host_;
};

}  // namespace dlcp::testing
