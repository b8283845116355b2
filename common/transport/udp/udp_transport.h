// UDP data plane: one non-blocking socket, sendmmsg/recvmmsg batches, per-message DSCP through an
// IP_TOS control message, and an eventfd so Wake() can interrupt a poll(2).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/transport/transport.h"
#include "common/transport/transport_options.h"

namespace dlcp {
absl::StatusOr<std::unique_ptr<Transport>> CreateUdpTransport(const TransportOptions& options);
}  // namespace dlcp
