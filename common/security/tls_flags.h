// The TLS settings of the binaries, declared once for dlcpd, dlcpctl and dlcp-bench.
#pragma once

#include "common/config/registry.h"
#include "common/security/tls.h"

namespace dlcp {

// --plaintext, --tls-cert, --tls-key, --tls-ca and, for clients, --tls-server-name
// (and their DLCP_* variables).
void DeclareTlsFlags(ConfigRegistry* config, bool server);
TlsOptions TlsOptionsFromConfig(const ConfigRegistry& config, bool server);

}  // namespace dlcp
