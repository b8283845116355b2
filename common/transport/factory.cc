#include "common/transport/loopback/loopback_transport.h"
#include "common/transport/transport.h"
#include "common/transport/udp/udp_transport.h"

#include "absl/strings/str_cat.h"

namespace dlcp {

absl::StatusOr<TransportOptions::Kind> ParseTransportKind(const std::string& name) {
  if (name == "udp") return TransportOptions::Kind::kUdp;
  if (name == "loopback") return TransportOptions::Kind::kLoopback;
  return absl::InvalidArgumentError(absl::StrCat("unknown transport '", name, "' (udp|loopback)"));
}

const char* TransportKindName(TransportOptions::Kind kind) {
  return kind == TransportOptions::Kind::kUdp ? "udp" : "loopback";
}

absl::StatusOr<std::unique_ptr<Transport>> CreateTransport(const TransportOptions& options) {
  if (options.max_datagram < 64 || options.max_datagram > 65507) {
    return absl::InvalidArgumentError(absl::StrCat("max_datagram ", options.max_datagram, " outside [64, 65507]"));
  }
  if (options.recv_batch == 0 || options.recv_batch > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("recv_batch ", options.recv_batch, " outside [1, 1024]"));
  }
  for (uint8_t d : options.dscp) {
    if (d > 63) return absl::InvalidArgumentError(absl::StrCat("DSCP ", d, " outside [0, 63]"));
  }
  switch (options.kind) {
    case TransportOptions::Kind::kUdp:
      return CreateUdpTransport(options);
    case TransportOptions::Kind::kLoopback:
      return CreateLoopbackTransport(options);
  }
  return absl::InvalidArgumentError("unknown transport kind");
}

}  // namespace dlcp
