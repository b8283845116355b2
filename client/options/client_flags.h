// The client option table (client_option_table.h) as flags of a binary's config registry, for
// programs that run a Client (dlcp-bench): each option is a flag (--window-bytes) and an
// environment variable (DLCP_WINDOW_BYTES), with the table's help, range and default.
#pragma once

#include <map>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "client/client.h"
#include "common/config/registry.h"

namespace dlcp {

struct ClientFlagsOptions {
  // Options the program sets itself (snake_case names), not declared as flags.
  std::set<std::string> own;
  // Defaults of the program's own in place of ClientOptions' (snake_case name -> text).
  std::map<std::string, std::string> defaults;
};

void DeclareClientFlags(ConfigRegistry* c, const ClientFlagsOptions& options = {});
// Every declared option's value into `out`. The registry validated each as it loaded.
absl::Status ClientOptionsFromFlags(const ConfigRegistry& c, const ClientFlagsOptions& options, ClientOptions* out);

}  // namespace dlcp
