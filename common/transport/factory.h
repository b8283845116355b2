// Makes the transport its options name (TransportOptions::kind): UDP, loopback, or RDMA where it
// is built and a device is usable; kAuto picks RDMA or falls back to UDP, logging why.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/transport/transport.h"
#include "common/transport/transport_options.h"

namespace dlcp {

absl::StatusOr<std::unique_ptr<Transport>> CreateTransport(const TransportOptions& options);

}  // namespace dlcp
