// DSCP marks on gRPC's TCP sockets, so control traffic (join, heartbeats, stats) rides the top
// priority class, as the data plane's control messages do. Without it a best-effort flood at a
// strict-priority switch starves heartbeats, and the aggregator drops healthy workers.
//
// gRPC offers this through a socket mutator whose definition is not in its public headers; the
// layout used here is the one gRPC 1.46 to 1.60 share. Other versions leave sockets unmarked
// (Supported() says which).
#pragma once

#include <grpcpp/server_builder.h>
#include <grpcpp/support/channel_arguments.h>

#include <cstdint>
#include <memory>

namespace dlcp {

bool SocketMarksSupported();
// Any thread. No-op where unsupported.
void MarkChannelDscp(grpc::ChannelArguments* args, uint8_t dscp);
// For ServerBuilder::SetOption; nullptr where unsupported.
std::unique_ptr<grpc::ServerBuilderOption> ServerDscpOption(uint8_t dscp);

}  // namespace dlcp
