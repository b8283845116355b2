// The settings a transport is made from (CreateTransport, factory.h): those every kind shares,
// and each kind's own, which live in its folder.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/transport/rdma/rdma_options.h"
#include "common/transport/transport.h"
#include "common/transport/udp/udp_options.h"

namespace dlcp {

struct TransportOptions {
  using Kind = TransportKind;
  Kind kind = Kind::kAuto;
  // Its family is the endpoint's: an IPv6 address ("::", "fd00::7") makes an IPv6-only UDP
  // endpoint, which sends to IPv6 peers alone. A Client moves the default to "::" when its first
  // aggregator has only an IPv6 address. RDMA takes IPv4 alone.
  std::string bind_host = "0.0.0.0";
  uint16_t port = 0;  // 0 picks a free port
  size_t max_datagram = 65507;
  size_t recv_batch = 64;
  // Socket buffers; large, because a round's window of chunks arrives as one burst.
  size_t socket_buffer_bytes = 32 << 20;
  // DSCP code point for each priority class.
  std::array<uint8_t, 4> dscp = {46, 34, 18, 0};
  // Spin on the socket instead of sleeping in poll(2). Only for dedicated cores.
  bool busy_poll = false;
  // UDP path spraying (docs/path-spraying.md): datagrams leave from this many source ports in
  // turn, so switches that hash the 5-tuple (ECMP) spread one endpoint's traffic over every
  // path. Each port carries a burst of up to spray_burst datagrams before the next takes over.
  // 1 turns spraying off. One extra socket per port serves every peer.
  uint32_t spray_ports = 16;
  // 0 chooses by datagram size (SprayBurstFor). Shorter bursts spread a window more evenly over
  // the paths, but each burst is one GSO send, so they cost sends: with jumbo frames 4 was
  // faster on every bed measured, while at MTU 1500 a CPU-bound node lost more to the extra
  // sends than it gained (docs/measurements/path-spraying.md, "Shorter bursts").
  uint32_t spray_burst = 0;
  static constexpr uint32_t kJumboSprayBurst = 4;
  static constexpr uint32_t kSprayBurst = 8;
  static constexpr size_t kJumboDatagram = 4096;  // larger than any RoCE MTU: RDMA keeps 8
  uint32_t SprayBurstFor(size_t datagram_bytes) const {
    if (spray_burst != 0) return spray_burst;
    return datagram_bytes > kJumboDatagram ? kJumboSprayBurst : kSprayBurst;
  }
  UdpOptions udp;
  RdmaOptions rdma;
};

absl::StatusOr<TransportOptions::Kind> ParseTransportKind(const std::string& name);
const char* TransportKindName(TransportOptions::Kind kind);
// Parses "46,34,18,0" into one DSCP code point per class (TransportOptions::dscp).
absl::Status ParseDscpMap(const std::string& text, std::array<uint8_t, 4>* out);

}  // namespace dlcp
