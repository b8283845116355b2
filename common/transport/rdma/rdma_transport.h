// RDMA data plane over RoCEv2: one unreliable-datagram (UD) queue pair per endpoint, which
// serves every peer, because datagram semantics are what bounded loss wants (a lost chunk is
// repaired or tolerated by the protocol, never retried by the NIC).
//
// - The device's RoCEv2 IPv4 GID is found by searching the GID table (or given by index); the
//   endpoint's Address is that GID's IPv4 address and the queue pair number.
// - Each priority class sends through an address handle whose GRH traffic class carries the
//   class's DSCP code point; receives report the DSCP they arrived with, from the GRH.
// - Datagrams are at most the port's active MTU (the GRH takes 40 bytes of each receive
//   buffer, not of the datagram).
// - Send and receive buffers are page-aligned pools registered once; receives sit on a shared
//   receive queue and are re-posted in batches; sends are posted in lists with one signalled
//   completion per RdmaOptions::signal_every; small datagrams go inline.
// - Receive blocks on the CQ's completion channel with poll(2) unless busy_poll is set.
//
// libibverbs is loaded at run time (verbs_loader.h). Threading as in transport.h.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/transport/transport.h"
#include "common/transport/transport_options.h"

namespace dlcp {
absl::StatusOr<std::unique_ptr<Transport>> CreateRdmaTransport(const TransportOptions& options);
}  // namespace dlcp
