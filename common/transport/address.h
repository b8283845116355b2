// A data-plane address: an IPv4 or IPv6 host and a port for UDP; for loopback, port alone names
// an in-process endpoint; for RDMA, the IPv4 address of a RoCEv2 GID and a UD queue pair number.
// Small and trivially copyable so it can sit in per-packet structures.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <array>
#include <compare>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace dlcp {

// A socket address of either family, as the kernel takes it.
struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;
  sockaddr* get() { return reinterpret_cast<sockaddr*>(&storage); }
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
};

struct Address {
  uint32_t ipv4 = 0;  // host byte order; 0 when v6
  uint16_t port = 0;
  uint32_t qpn = 0;  // RDMA only (24 bits); 0 elsewhere
  std::array<uint8_t, 16> ipv6{};  // network order; only when v6
  bool v6 = false;
  bool operator==(const Address&) const = default;
  auto operator<=>(const Address&) const = default;  // an order for sorting, nothing more
  template <typename H>
  friend H AbslHashValue(H h, const Address& a) {
    return H::combine(std::move(h), a.ipv4, a.port, a.qpn, a.ipv6, a.v6);
  }

  static Address V6(const std::array<uint8_t, 16>& ip, uint16_t port);
  // "a.b.c.d:port" or "[v6]:port", or "a.b.c.d/qpN" for RDMA.
  std::string ToString() const;
  std::string HostString() const;  // "a.b.c.d" or "v6", unbracketed
  // AF_INET, or AF_INET6 for a v6 address.
  int family() const { return v6 ? AF_INET6 : AF_INET; }
  bool wildcard() const;  // 0.0.0.0 or ::
  SockAddr ToSockaddr() const;
  // From an AF_INET or AF_INET6 address; an IPv4-mapped IPv6 one (::ffff:a.b.c.d) is IPv4.
  // Anything else comes back as the empty Address.
  static Address FromSockaddr(const sockaddr* sa);
};

const char* FamilyName(int family);  // "IPv4", "IPv6"

// Resolves "host:port" (a literal of either family or a name) to an Address. `family` (AF_INET,
// AF_INET6) takes only addresses of that family, and says so when the host has none: peers of one
// data plane must share a family. AF_UNSPEC takes an IPv4 address where the host has one.
absl::StatusOr<Address> ResolveAddress(const std::string& host, uint16_t port, int family = AF_UNSPEC);
absl::StatusOr<Address> ResolveHostPort(const std::string& host_port, int family = AF_UNSPEC);

}  // namespace dlcp
