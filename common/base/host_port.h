// "HOST:PORT" parsing, shared by the config validators, address resolution and the client.
// An IPv6 host is bracketed, "[::1]:7000", as in URLs and gRPC targets; SplitHostPort returns it
// without the brackets. The host must be non-empty; the port is 0..65535.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace dlcp {

absl::StatusOr<std::pair<std::string, uint16_t>> SplitHostPort(const std::string& host_port);

// The inverse: brackets a host that holds a ':' (an IPv6 literal).
std::string JoinHostPort(const std::string& host, uint32_t port);

}  // namespace dlcp
