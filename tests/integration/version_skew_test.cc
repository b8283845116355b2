// Workers and aggregators of different data-plane wire formats refuse each other at join, naming
// both formats and releases, instead of refusing every datagram of the job and timing out.
#include <gtest/gtest.h>

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/base/build_config.h"
#include "common/wire/header.h"
#include "dlcp/v1/control.grpc.pb.h"
#include "tests/integration/client_test_util.h"
#include "tests/integration/test_aggregator.h"

namespace dlcp::testing {
namespace {

v1::JoinRequest UdpJoin(const std::string& job) {
  v1::JoinRequest req;
  req.set_job_name(job);
  req.set_world_size(1);
  req.set_chunk_bytes(1024);
  req.set_data_host("127.0.0.1");
  req.set_data_port(9);
  req.set_worker_keys(true);
  return req;
}

grpc::Status Join(v1::Aggregator::Stub* stub, const v1::JoinRequest& req, v1::JoinResponse* resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return stub->Join(&ctx, req, resp);
}

TEST(VersionSkew, AnAggregatorRefusesAWorkerOfAnotherWireFormatNamingBoth) {
  auto agg = TestAggregator::Start({});
  ASSERT_NE(agg, nullptr);
  auto stub = v1::Aggregator::NewStub(grpc::CreateChannel(agg->address(), grpc::InsecureChannelCredentials()));
  const uint32_t mine = wire::kVersion;

  v1::JoinRequest req = UdpJoin("newer");
  req.set_wire_version(mine + 1);
  req.set_client_version("9.9.9");
  v1::JoinResponse resp;
  grpc::Status st = Join(stub.get(), req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_NE(st.error_message().find(absl::StrCat("the worker speaks data-plane wire version ", mine + 1,
                                                 " (dlcp 9.9.9) but aggregator test speaks version ", mine,
                                                 " (dlcp ", DLCP_VERSION, ")")),
            std::string::npos)
      << st.error_message();

  req.set_client_version(std::string(65, 'x'));
  st = Join(stub.get(), req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_NE(st.error_message().find("client_version is 65 bytes; at most 64"), std::string::npos)
      << st.error_message();

  // A client from before versions were announced sends none, and speaks version 1.
  req = UdpJoin("older");
  st = Join(stub.get(), req, &resp);
  ASSERT_EQ(mine, 1u);
  EXPECT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.wire_version(), mine);
  EXPECT_EQ(resp.aggregator_version(), DLCP_VERSION);

  v1::Stats stats;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  ASSERT_TRUE(stub->GetStats(&ctx, v1::GetStatsRequest(), &stats).ok());
  EXPECT_EQ(stats.version(), DLCP_VERSION);
  EXPECT_EQ(stats.wire_version(), mine);
}

// Answers every join as an aggregator of the next wire format would, and records the leaves.
class NewerAggregator final : public v1::Aggregator::CallbackService {
 public:
  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* ctx, const v1::JoinRequest* req,
                                 v1::JoinResponse* resp) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      announced_ = req->wire_version();
      client_version_ = req->client_version();
    }
    resp->set_job_id(7);
    resp->set_epoch(1);
    resp->set_aggregator_id("newer");
    resp->set_wire_version(wire::kVersion + 1);
    resp->set_aggregator_version("2.0.0");
    v1::Endpoint* e = resp->add_data_endpoints();
    e->set_host("127.0.0.1");
    e->set_port(9);
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* ctx, const v1::LeaveRequest* req,
                                  v1::LeaveResponse*) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      left_job_ = req->job_id();
      leave_reason_ = req->reason();
    }
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }

  std::mutex mu_;
  uint32_t announced_ = 0;
  std::string client_version_;
  uint32_t left_job_ = 0;
  std::string leave_reason_;
};

TEST(VersionSkew, AClientRefusesAnAggregatorOfAnotherWireFormatAndLeavesItsJob) {
  NewerAggregator newer;
  int port = 0;
  grpc::ServerBuilder b;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  b.RegisterService(&newer);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const std::string address = absl::StrCat("127.0.0.1:", port);

  auto c = Client::Connect(Opts(address, "skew"));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition) << c.status();
  const std::string why = absl::StrCat("aggregator ", address, " speaks data-plane wire version ",
                                       wire::kVersion + 1, " (dlcp 2.0.0) but this client speaks version ",
                                       static_cast<uint32_t>(wire::kVersion), " (dlcp ", DLCP_VERSION, ")");
  EXPECT_NE(c.status().message().find(why), std::string::npos) << c.status();

  {
    std::lock_guard<std::mutex> lock(newer.mu_);
    EXPECT_EQ(newer.announced_, wire::kVersion);
    EXPECT_EQ(newer.client_version_, DLCP_VERSION);
    EXPECT_EQ(newer.left_job_, 7u);
    EXPECT_NE(newer.leave_reason_.find(why), std::string::npos) << newer.leave_reason_;
  }
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

}  // namespace
}  // namespace dlcp::testing
