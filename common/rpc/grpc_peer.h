// gRPC's peer strings ("ipv4:10.0.0.1:5000", "ipv6:%5B::1%5D:5000") read as addresses.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

namespace dlcp {

// The IP and port in a gRPC peer string; nullopt if it is not IP.
std::optional<std::pair<std::string, uint16_t>> PeerHostPort(const std::string& peer);
// Its IP alone; empty if it is not IP.
std::string PeerHost(const std::string& peer);

}  // namespace dlcp
