#include "common/base/host_port.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace dlcp {

absl::StatusOr<std::pair<std::string, uint16_t>> SplitHostPort(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat("expected HOST:PORT, got '", host_port, "'"));
  }
  int port = 0;
  if (!absl::SimpleAtoi(host_port.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("port of '", host_port, "' must be 0..65535"));
  }
  return std::make_pair(host_port.substr(0, colon), static_cast<uint16_t>(port));
}

}  // namespace dlcp
