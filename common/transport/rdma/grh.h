// The 40 bytes a UD receive places before every datagram. For RoCEv2 over IPv4 the first 20
// are unspecified and the IPv4 header fills the last 20; over IPv6 the IPv6 header fills all 40
// (as in rdma-core's ibv_init_ah_from_wc, the IPv4 header is recognised by its checksum, or, as
// Soft-RoCE delivers it, by zeroed leading bytes and a checksum left to offload).
// Pure functions on bytes, so they are tested without a device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace dlcp::rdma {

inline constexpr size_t kGrhBytes = 40;

struct GrhSource {
  uint32_t ipv4 = 0;  // host byte order
  int dscp = 0;
};

// The sender's IPv4 address and the DSCP it sent with; nullopt when the header is neither a
// valid IPv4 header nor an IPv6 one from an IPv4-mapped GID (dlcp addresses peers by IPv4).
std::optional<GrhSource> ParseGrh(const uint8_t* grh);

// The IPv4-mapped GID (::ffff:a.b.c.d) of an address, and back.
void Ipv4ToGid(uint32_t ipv4, uint8_t gid[16]);
std::optional<uint32_t> GidToIpv4(const uint8_t gid[16]);

}  // namespace dlcp::rdma
