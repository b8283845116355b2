// DSCP marks on gRPC's TCP sockets, so control traffic (join, heartbeats, stats) rides the top
// priority class, as the data plane's control messages do. Without it a best-effort flood at a
// strict-priority switch starves heartbeats, and the aggregator drops healthy workers.
//
// A client's channel marks its sockets through gRPC's socket mutator, whose definition is not in
// gRPC's public headers; the layout used here is the one gRPC 1.46 to 1.60 share. Other versions
// leave those sockets unmarked (SocketMarksSupported() says which). dlcpd marks its listening
// sockets itself (server/control/limited_listener.h), and accepted connections inherit the mark.
#pragma once

#include <grpcpp/support/channel_arguments.h>

#include <cstdint>
#include <memory>

namespace dlcp {

bool SocketMarksSupported();
// Any thread. No-op where unsupported.
void MarkChannelDscp(grpc::ChannelArguments* args, uint8_t dscp);
// Marks one socket, IPv4 or IPv6. Best effort: a socket that refuses (a Unix socket) stays as it is.
void MarkSocketDscp(int fd, uint8_t dscp);

}  // namespace dlcp
