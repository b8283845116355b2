// In-process transport for tests and single-process runs: endpoints in one process exchange
// datagrams through bounded queues, keyed by port. A full queue drops the datagram, as a full
// socket buffer would, so the protocol's repair paths run here too.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/transport/transport.h"
#include "common/transport/transport_options.h"

namespace dlcp {
absl::StatusOr<std::unique_ptr<Transport>> CreateLoopbackTransport(const TransportOptions& options);
}  // namespace dlcp
