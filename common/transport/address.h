// A data-plane address: IPv4 and port for UDP; for loopback, port alone names an in-process
// endpoint. Small and trivially copyable so it can sit in per-packet structures.
#pragma once

#include <netinet/in.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace dlcp {

struct Address {
  uint32_t ipv4 = 0;  // host byte order
  uint16_t port = 0;
  bool operator==(const Address&) const = default;
  std::string ToString() const;  // "a.b.c.d:port"
  std::string HostString() const;  // "a.b.c.d"
  sockaddr_in ToSockaddr() const;
  static Address FromSockaddr(const sockaddr_in& sa);
};

// Resolves "host:port" (IPv4 literal or name) to an Address.
absl::StatusOr<Address> ResolveAddress(const std::string& host, uint16_t port);
absl::StatusOr<Address> ResolveHostPort(const std::string& host_port);

}  // namespace dlcp
