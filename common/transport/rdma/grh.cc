#include "common/transport/rdma/grh.h"

#include <algorithm>
#include <cstring>

namespace dlcp::rdma {
namespace {

uint32_t Be32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) << 24 | static_cast<uint32_t>(p[1]) << 16 | static_cast<uint32_t>(p[2]) << 8 | p[3];
}

bool IsValidIpv4Header(const uint8_t* grh) {
  const uint8_t* h = grh + 20;
  if (h[0] != 0x45) return false;  // version 4, 20-byte header: RoCEv2 sends no options
  // Soft-RoCE copies the header of a packet whose checksum was left to offload (0) and zeroes
  // the 20 bytes before it; an IPv6 header never has those bytes zero (its version is 6).
  if (std::all_of(grh, grh + 20, [](uint8_t b) { return b == 0; })) return true;
  uint32_t sum = 0;
  for (int i = 0; i < 20; i += 2) sum += static_cast<uint32_t>(h[i]) << 8 | h[i + 1];
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  return sum == 0xffff;
}

}  // namespace

void Ipv4ToGid(uint32_t ipv4, uint8_t gid[16]) {
  std::memset(gid, 0, 10);
  gid[10] = gid[11] = 0xff;
  gid[12] = static_cast<uint8_t>(ipv4 >> 24);
  gid[13] = static_cast<uint8_t>(ipv4 >> 16);
  gid[14] = static_cast<uint8_t>(ipv4 >> 8);
  gid[15] = static_cast<uint8_t>(ipv4);
}

std::optional<uint32_t> GidToIpv4(const uint8_t gid[16]) {
  for (int i = 0; i < 10; ++i) {
    if (gid[i] != 0) return std::nullopt;
  }
  if (gid[10] != 0xff || gid[11] != 0xff) return std::nullopt;
  return Be32(gid + 12);
}

std::optional<GrhSource> ParseGrh(const uint8_t* grh) {
  const uint8_t* ip4 = grh + 20;
  if (IsValidIpv4Header(grh)) return GrhSource{Be32(ip4 + 12), ip4[1] >> 2};
  if ((grh[0] >> 4) != 6) return std::nullopt;
  const int traffic_class = (grh[0] & 0x0f) << 4 | grh[1] >> 4;
  std::optional<uint32_t> src = GidToIpv4(grh + 8);
  if (!src) return std::nullopt;
  return GrhSource{*src, traffic_class >> 2};
}

}  // namespace dlcp::rdma
