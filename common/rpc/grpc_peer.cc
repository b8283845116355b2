#include "common/rpc/grpc_peer.h"

#include "absl/strings/str_replace.h"
#include "common/base/host_port.h"

namespace dlcp {

std::optional<std::pair<std::string, uint16_t>> PeerHostPort(const std::string& peer) {
  const bool v6 = peer.rfind("ipv6:", 0) == 0;
  if (!v6 && peer.rfind("ipv4:", 0) != 0) return std::nullopt;
  // gRPC writes an IPv6 peer as a URI: "ipv6:%5B::1%5D:5000", or bracketed on older releases.
  std::string rest = absl::StrReplaceAll(peer.substr(5), {{"%5B", "["}, {"%5D", "]"}, {"%25", "%"}});
  absl::StatusOr<std::pair<std::string, uint16_t>> hp = SplitHostPort(rest);
  if (!hp.ok()) return std::nullopt;
  return *hp;
}

std::string PeerHost(const std::string& peer) {
  std::optional<std::pair<std::string, uint16_t>> hp = PeerHostPort(peer);
  return hp ? hp->first : "";
}

}  // namespace dlcp
