// The client's options, declared once. Each row names one field of ClientOptions, with its type,
// unit, range, help and how to read and write it as text. Every surface comes from this table:
// the Python keyword arguments and their docstring, the C settings string, the dlcp-bench flags
// and the settings table in docs/configuration.md (tests/unit/settings_tables_test.cc checks each). Defaults
// are ClientOptions' own, read through the table.
//
// Names are snake_case (Python keywords, C settings); flags are the same in kebab-case
// (--window-bytes) and environment variables DLCP_ and upper case (DLCP_WINDOW_BYTES). Units are
// in the name: _ms for durations, _bytes for sizes.
//
// Thread-safe: the table is built once and never changes.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/client.h"

namespace dlcp {

struct ClientOption {
  enum class Type { kBool, kInt, kDouble, kString };
  std::string name;  // snake_case
  Type type = Type::kString;
  double min = 0, max = 0;  // kInt and kDouble: the range, inclusive
  std::string choices;      // kString with fixed values: "auto|udp|rdma"; else empty
  std::string help;
  // The field as text ("true", "5000", "f32").
  std::function<std::string(const ClientOptions&)> get;
  // Parses `text` (type, range and choices checked) into the field; the error says what is wrong
  // with the value, not which option it was.
  std::function<absl::Status(const std::string& text, ClientOptions*)> set;

  std::string flag() const;      // "window-bytes"
  std::string env_name() const;  // "DLCP_WINDOW_BYTES"
  std::string default_text() const { return get(ClientOptions{}); }
};

// Every option, in the order the docs list them.
absl::Span<const ClientOption> ClientOptionTable();
// The row of `name` (snake_case), or nullptr.
const ClientOption* FindClientOption(const std::string& name);

// ClientOptions from `explicit_values` (snake_case name -> text), then the DLCP_* environment
// through `env`, then the defaults: the precedence every binary's flags have. An unknown name or a
// bad value is INVALID_ARGUMENT naming the option and where the value came from (`origin`:
// "keyword argument", "setting", ...).
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
absl::Status ApplyClientOptions(const std::map<std::string, std::string>& explicit_values, const EnvLookup& env,
                                const std::string& origin, ClientOptions* out);
// The process environment, for ApplyClientOptions.
std::optional<std::string> ProcessEnv(const std::string& name);

// The job's name: `given`, else the one a launcher gives every worker of a run alike and no
// other run at the same time: torchrun's TORCHELASTIC_RUN_ID (unless "none", its value without
// --rdzv_id), else MASTER_ADDR:MASTER_PORT (torchrun, torch.distributed.launch, Kubeflow's
// PyTorchJob). With neither, INVALID_ARGUMENT saying how to name the job: a fixed fallback
// would sum two unrelated runs together.
absl::StatusOr<std::string> ResolveJobName(const std::string& given, const EnvLookup& env);

// "name=value,name=value" (the C API's settings string) as a map; a malformed item is
// INVALID_ARGUMENT naming it.
absl::StatusOr<std::map<std::string, std::string>> ParseSettingsString(const std::string& settings);

// The settings table of docs/configuration.md: one Markdown row per option.
std::string ClientOptionsMarkdown();

}  // namespace dlcp
