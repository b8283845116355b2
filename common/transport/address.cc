#include "common/transport/address.h"

#include <arpa/inet.h>
#include <netdb.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/host_port.h"

namespace dlcp {
namespace {

constexpr std::array<uint8_t, 12> kV4MappedPrefix = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

}  // namespace

Address Address::V6(const std::array<uint8_t, 16>& ip, uint16_t port) {
  Address a;
  a.ipv6 = ip;
  a.port = port;
  a.v6 = true;
  return a;
}

std::string Address::HostString() const {
  if (v6) {
    char buf[INET6_ADDRSTRLEN];
    return inet_ntop(AF_INET6, ipv6.data(), buf, sizeof(buf)) != nullptr ? std::string(buf) : std::string("?");
  }
  return absl::StrCat((ipv4 >> 24) & 0xff, ".", (ipv4 >> 16) & 0xff, ".", (ipv4 >> 8) & 0xff, ".", ipv4 & 0xff);
}

std::string Address::ToString() const {
  return qpn != 0 ? absl::StrCat(HostString(), "/qp", qpn) : JoinHostPort(HostString(), port);
}

bool Address::wildcard() const { return v6 ? ipv6 == std::array<uint8_t, 16>{} : ipv4 == 0; }

SockAddr Address::ToSockaddr() const {
  SockAddr out;
  if (v6) {
    auto* sa = reinterpret_cast<sockaddr_in6*>(&out.storage);
    sa->sin6_family = AF_INET6;
    sa->sin6_port = htons(port);
    std::memcpy(&sa->sin6_addr, ipv6.data(), 16);
    out.len = sizeof(sockaddr_in6);
  } else {
    auto* sa = reinterpret_cast<sockaddr_in*>(&out.storage);
    sa->sin_family = AF_INET;
    sa->sin_port = htons(port);
    sa->sin_addr.s_addr = htonl(ipv4);
    out.len = sizeof(sockaddr_in);
  }
  return out;
}

Address Address::FromSockaddr(const sockaddr* sa) {
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    return Address{ntohl(in->sin_addr.s_addr), ntohs(in->sin_port)};
  }
  if (sa->sa_family != AF_INET6) return Address{};
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
  std::array<uint8_t, 16> ip;
  std::memcpy(ip.data(), &in6->sin6_addr, 16);
  if (std::memcmp(ip.data(), kV4MappedPrefix.data(), kV4MappedPrefix.size()) == 0) {
    return Address{uint32_t{ip[12]} << 24 | uint32_t{ip[13]} << 16 | uint32_t{ip[14]} << 8 | ip[15],
                   ntohs(in6->sin6_port)};
  }
  return V6(ip, ntohs(in6->sin6_port));
}

const char* FamilyName(int family) { return family == AF_INET6 ? "IPv6" : "IPv4"; }

absl::StatusOr<Address> ResolveAddress(const std::string& host, uint16_t port, int family) {
  addrinfo hints;
  std::memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot resolve host '", host, "': ", gai_strerror(rc)));
  }
  const auto first_of = [res](int want) -> const addrinfo* {
    for (const addrinfo* r = res; r != nullptr; r = r->ai_next) {
      if (r->ai_family == want) return r;
    }
    return nullptr;
  };
  // The first of the family asked for; without one asked, IPv4 before IPv6.
  const addrinfo* pick = first_of(family == AF_UNSPEC ? AF_INET : family);
  if (pick == nullptr && family == AF_UNSPEC) pick = first_of(AF_INET6);
  Address out = pick != nullptr ? Address::FromSockaddr(pick->ai_addr) : Address{};
  const int found = res->ai_family;
  freeaddrinfo(res);
  // An IPv4-mapped IPv6 address reads back as IPv4: not of the family asked for either.
  if (pick == nullptr || (family != AF_UNSPEC && out.family() != family)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host '", host, "' has no ", FamilyName(family), " address (it is ", FamilyName(found),
        "), and this data plane runs over ", FamilyName(family), ": every peer of a job must use one family"));
  }
  out.port = port;
  return out;
}

absl::StatusOr<Address> ResolveHostPort(const std::string& host_port, int family) {
  absl::StatusOr<std::pair<std::string, uint16_t>> hp = SplitHostPort(host_port);
  if (!hp.ok()) return hp.status();
  return ResolveAddress(hp->first, hp->second, family);
}

}  // namespace dlcp
