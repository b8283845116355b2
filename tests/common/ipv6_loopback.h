// Whether this host can bind ::1. Containers and CI machines sometimes run with IPv6 off; tests
// over IPv6 then skip, saying why, rather than fail.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace dlcp::testing {

inline bool HasIpv6Loopback() {
  const int fd = ::socket(AF_INET6, SOCK_DGRAM, 0);
  if (fd < 0) return false;
  sockaddr_in6 sa{};
  sa.sin6_family = AF_INET6;
  sa.sin6_addr = in6addr_loopback;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0;
  ::close(fd);
  return ok;
}

inline constexpr char kNoIpv6[] = "this host cannot bind ::1 (IPv6 is off)";

}  // namespace dlcp::testing
