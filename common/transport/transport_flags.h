// The data-plane transport settings of the binaries, declared once for dlcpd and dlcp-bench:
// --transport, --udp-offload, --spray-ports, --spray-burst and the --rdma-* settings (and their DLCP_* variables).
#pragma once

#include "common/config/registry.h"
#include "common/transport/transport.h"
#include "common/transport/transport_options.h"

namespace dlcp {

void DeclareTransportFlags(ConfigRegistry* config);
// Fills the fields the flags own, leaving the others as they are.
void TransportOptionsFromConfig(const ConfigRegistry& config, TransportOptions* options);

}  // namespace dlcp
