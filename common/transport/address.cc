#include "common/transport/address.h"

#include <arpa/inet.h>
#include <netdb.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/host_port.h"

namespace dlcp {

std::string Address::HostString() const {
  return absl::StrCat((ipv4 >> 24) & 0xff, ".", (ipv4 >> 16) & 0xff, ".", (ipv4 >> 8) & 0xff, ".", ipv4 & 0xff);
}

std::string Address::ToString() const {
  return qpn != 0 ? absl::StrCat(HostString(), "/qp", qpn) : absl::StrCat(HostString(), ":", port);
}

// IPv4 in the high half; in the low half, bit 30 marks a packed address (so none packs to 0)
// and bit 31 tells a queue pair from a port.
uint64_t Address::Pack() const {
  const uint64_t low = qpn != 0 ? (uint64_t{1} << 31 | (qpn & 0xffffff)) : port;
  return static_cast<uint64_t>(ipv4) << 32 | uint64_t{1} << 30 | low;
}

Address Address::Unpack(uint64_t packed) {
  Address a;
  a.ipv4 = static_cast<uint32_t>(packed >> 32);
  if (packed & (uint64_t{1} << 31)) {
    a.qpn = static_cast<uint32_t>(packed & 0xffffff);
  } else {
    a.port = static_cast<uint16_t>(packed & 0xffff);
  }
  return a;
}

sockaddr_in Address::ToSockaddr() const {
  sockaddr_in sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(ipv4);
  return sa;
}

Address Address::FromSockaddr(const sockaddr_in& sa) { return Address{ntohl(sa.sin_addr.s_addr), ntohs(sa.sin_port)}; }

absl::StatusOr<Address> ResolveAddress(const std::string& host, uint16_t port) {
  in_addr a;
  if (inet_pton(AF_INET, host.c_str(), &a) == 1) return Address{ntohl(a.s_addr), port};
  addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot resolve host '", host, "': ", gai_strerror(rc)));
  }
  Address out = Address::FromSockaddr(*reinterpret_cast<sockaddr_in*>(res->ai_addr));
  out.port = port;
  freeaddrinfo(res);
  return out;
}

absl::StatusOr<Address> ResolveHostPort(const std::string& host_port) {
  absl::StatusOr<std::pair<std::string, uint16_t>> hp = SplitHostPort(host_port);
  if (!hp.ok()) return hp.status();
  return ResolveAddress(hp->first, hp->second);
}

}  // namespace dlcp
