#include "common/base/host_port.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace dlcp {

absl::StatusOr<std::pair<std::string, uint16_t>> SplitHostPort(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return absl::InvalidArgumentError(absl::StrCat("expected HOST:PORT, got '", host_port, "'"));
  }
  std::string host = host_port.substr(0, colon);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']' || host.find_first_of("[]", 1) != host.size() - 1) {
      return absl::InvalidArgumentError(absl::StrCat("expected [IPV6]:PORT, got '", host_port, "'"));
    }
    host = host.substr(1, host.size() - 2);
  } else if (host.find_first_of(":[]") != std::string::npos) {
    // "::1:7000" could be host ::1 or host ::1:7000 with no port.
    return absl::InvalidArgumentError(
        absl::StrCat("an IPv6 host takes brackets, as in [::1]:7000; got '", host_port, "'"));
  }
  int port = 0;
  if (!absl::SimpleAtoi(host_port.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("port of '", host_port, "' must be 0..65535"));
  }
  return std::make_pair(std::move(host), static_cast<uint16_t>(port));
}

std::string JoinHostPort(const std::string& host, uint32_t port) {
  return host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

}  // namespace dlcp
