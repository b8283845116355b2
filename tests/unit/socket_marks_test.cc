// gRPC's control connections carry the top class's DSCP on both ends, so a best-effort flood at
// a strict-priority switch cannot starve heartbeats: the client's through its channel, dlcpd's
// through its listener (LimitedListener), whose mark accepted connections inherit. Checked on the
// live sockets with ss(8).
#include <gtest/gtest.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/rpc/socket_marks.h"
#include "server/control/health_service.h"
#include "server/control/limited_listener.h"

namespace dlcp {
namespace {

std::string Shell(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

TEST(SocketMarks, ControlConnectionsRideTheTopClassBothWays) {
  if (!SocketMarksSupported()) GTEST_SKIP() << "this gRPC version's socket mutator layout is not known";
  if (Shell("command -v ss").empty()) GTEST_SKIP() << "ss (iproute2) is not installed";
  server::HealthService health;
  ConnectionLimiter limiter(ConnectionLimits{});
  absl::StatusOr<std::unique_ptr<server::LimitedListener>> listener =
      server::LimitedListener::Bind("127.0.0.1", 0, 46, &limiter);
  ASSERT_TRUE(listener.ok()) << listener.status();
  const int port = (*listener)->port();
  grpc::ServerBuilder b;
  b.RegisterService(&health);
  (*listener)->ServeWith(&b, grpc::InsecureServerCredentials());
  auto server = b.BuildAndStart();
  ASSERT_NE(server, nullptr);
  (*listener)->Start();
  grpc::ChannelArguments args;
  MarkChannelDscp(&args, 46);
  auto channel = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials(), args);
  ASSERT_TRUE(channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(5)));
  // Both ends of the connection: the client's socket (peer :port) and the server's (local :port).
  int marked = 0, unmarked = 0;
  for (absl::string_view line : absl::StrSplit(Shell("ss -tn --tos state established"), '\n')) {
    if (line.find(absl::StrCat(":", port, " ")) == std::string::npos) continue;
    (line.find("tos:0xb8") != std::string::npos ? marked : unmarked)++;
  }
  EXPECT_EQ(marked, 2) << Shell("ss -tn --tos state established");
  EXPECT_EQ(unmarked, 0);
  server->Shutdown();
}

}  // namespace
}  // namespace dlcp
