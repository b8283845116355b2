#include "client/options/client_flags.h"

#include "absl/strings/str_cat.h"
#include "client/options/client_option_table.h"

namespace dlcp {

void DeclareClientFlags(ConfigRegistry* c, const ClientFlagsOptions& options) {
  for (const ClientOption& o : ClientOptionTable()) {
    if (options.own.count(o.name) != 0) continue;
    auto d = options.defaults.find(o.name);
    const std::string def = d != options.defaults.end() ? d->second : o.default_text();
    if (o.type == ClientOption::Type::kBool) {
      c->AddBool(o.flag(), def == "true", o.help);
      continue;
    }
    std::string help = o.help;
    if (!o.choices.empty()) absl::StrAppend(&help, " (", o.choices, ")");
    const ClientOption* row = &o;  // the table outlives every registry
    c->AddString(o.flag(), def, help, [row](const std::string& v) {
      ClientOptions scratch;
      return row->set(v, &scratch);
    });
  }
}

absl::Status ClientOptionsFromFlags(const ConfigRegistry& c, const ClientFlagsOptions& options, ClientOptions* out) {
  for (const ClientOption& o : ClientOptionTable()) {
    if (options.own.count(o.name) != 0) continue;
    const std::string text =
        o.type == ClientOption::Type::kBool ? (c.GetBool(o.flag()) ? "true" : "false") : c.GetString(o.flag());
    if (absl::Status s = o.set(text, out); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--", o.flag(), ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace dlcp
