// UDP settings of a transport (TransportOptions::udp); common/transport/udp/udp_transport.h uses
// them.
#pragma once

namespace dlcp {

struct UdpOptions {
  // Batch same-size datagrams to one peer into one GSO send, and accept coalesced (GRO) receives.
  // Both fall back silently where the kernel or path does not support them.
  bool gso = true;
  bool gro = true;
};

}  // namespace dlcp
