// "HOST:PORT" parsing, shared by the config validators, address resolution and the client.
// The host is everything before the last ':', so it must be non-empty; the port is 0..65535.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace dlcp {

absl::StatusOr<std::pair<std::string, uint16_t>> SplitHostPort(const std::string& host_port);

}  // namespace dlcp
