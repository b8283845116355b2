// A data-plane address: IPv4 and port for UDP; for loopback, port alone names an in-process
// endpoint; for RDMA, the IPv4 address of a RoCEv2 GID and a UD queue pair number. Small and
// trivially copyable so it can sit in per-packet structures.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace dlcp {

struct Address {
  uint32_t ipv4 = 0;  // host byte order
  uint16_t port = 0;
  uint32_t qpn = 0;  // RDMA only (24 bits); 0 elsewhere
  bool operator==(const Address&) const = default;
  // One 64-bit value per address (a map key, an atomic): never 0, and Unpack(Pack()) is identity.
  uint64_t Pack() const;
  static Address Unpack(uint64_t packed);
  std::string ToString() const;  // "a.b.c.d:port", or "a.b.c.d/qpN" for RDMA
  std::string HostString() const;  // "a.b.c.d"
  sockaddr_in ToSockaddr() const;
  static Address FromSockaddr(const sockaddr_in& sa);
};

// Resolves "host:port" (IPv4 literal or name) to an Address.
absl::StatusOr<Address> ResolveAddress(const std::string& host, uint16_t port);
absl::StatusOr<Address> ResolveHostPort(const std::string& host_port);

}  // namespace dlcp
