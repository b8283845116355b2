#include "common/config/registry.h"

#include <cstdlib>
#include <iostream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/base/build_config.h"
#include "common/base/check.h"
#include "common/base/host_port.h"

namespace dlcp {

ConfigRegistry::ConfigRegistry(std::string program, std::string summary)
    : program_(std::move(program)), summary_(std::move(summary)) {}

void ConfigRegistry::Add(const std::string& name, Entry e) {
  DLCP_CHECK(entries_.find(name) == entries_.end());
  e.value = e.default_text;
  entries_.emplace(name, std::move(e));
}

void ConfigRegistry::AddString(const std::string& name, std::string def, std::string help, Validator validator) {
  Entry e{Type::kString, std::move(help), std::move(def)};
  e.validator = std::move(validator);
  Add(name, std::move(e));
}

void ConfigRegistry::AddInt(const std::string& name, int64_t def, int64_t min, int64_t max, std::string help) {
  Entry e{Type::kInt, std::move(help), absl::StrCat(def)};
  e.imin = min;
  e.imax = max;
  Add(name, std::move(e));
}

void ConfigRegistry::AddDouble(const std::string& name, double def, double min, double max, std::string help) {
  Entry e{Type::kDouble, std::move(help), absl::StrCat(def)};
  e.dmin = min;
  e.dmax = max;
  Add(name, std::move(e));
}

void ConfigRegistry::AddBool(const std::string& name, bool def, std::string help) {
  Add(name, Entry{Type::kBool, std::move(help), def ? "true" : "false"});
}

std::string ConfigRegistry::EnvName(const std::string& name) {
  std::string env = "DLCP_" + absl::AsciiStrToUpper(name);
  for (char& c : env) {
    if (c == '-') c = '_';
  }
  return env;
}

absl::Status ConfigRegistry::Set(const std::string& name, const std::string& value, const std::string& source) {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown setting --", name, " (see --help)"));
  }
  it->second.value = value;
  it->second.source = source;
  return absl::OkStatus();
}

absl::Status ConfigRegistry::Validate(const std::string& name, Entry& e) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid value '", e.value, "' for --", name, " (from ", e.source, "): ", why));
  };
  switch (e.type) {
    case Type::kString:
      if (e.validator) {
        absl::Status s = e.validator(e.value);
        if (!s.ok()) return bad(std::string(s.message()));
      }
      break;
    case Type::kInt:
      if (!absl::SimpleAtoi(e.value, &e.ivalue)) return bad("not an integer");
      if (e.ivalue < e.imin || e.ivalue > e.imax) return bad(absl::StrCat("must be in [", e.imin, ", ", e.imax, "]"));
      break;
    case Type::kDouble:
      if (!absl::SimpleAtod(e.value, &e.dvalue)) return bad("not a number");
      if (!(e.dvalue >= e.dmin && e.dvalue <= e.dmax)) return bad(absl::StrCat("must be in [", e.dmin, ", ", e.dmax, "]"));
      break;
    case Type::kBool:
      if (!absl::SimpleAtob(e.value, &e.bvalue)) return bad("not a boolean (true|false|1|0|yes|no)");
      break;
  }
  return absl::OkStatus();
}

absl::Status ConfigRegistry::Load(const std::vector<std::string>& args, const EnvLookup& env) {
  std::map<std::string, bool> from_flags;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      continue;
    }
    if (arg == "--version") {
      version_requested_ = true;
      continue;
    }
    if (arg == "--dump-config") {
      dump_requested_ = true;
      continue;
    }
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      positional_.push_back(arg);
      continue;
    }
    std::string body = arg.substr(2);
    std::string name, value;
    size_t eq = body.find('=');
    if (eq != std::string::npos) {
      name = body.substr(0, eq);
      value = body.substr(eq + 1);
    } else {
      name = body;
      auto it = entries_.find(name);
      if (it == entries_.end() && name.rfind("no-", 0) == 0) {
        auto neg = entries_.find(name.substr(3));
        if (neg != entries_.end() && neg->second.type == Type::kBool) {
          name = name.substr(3);
          value = "false";
          goto set;
        }
      }
      if (it != entries_.end() && it->second.type == Type::kBool) {
        value = "true";
      } else if (it != entries_.end()) {
        if (i + 1 >= args.size()) {
          return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
        }
        value = args[++i];
      }
    }
  set:
    if (absl::Status s = Set(name, value, "flag"); !s.ok()) return s;
    from_flags[name] = true;
  }
  for (auto& [name, e] : entries_) {
    if (from_flags.count(name)) continue;
    std::optional<std::string> v = env(EnvName(name));
    if (v.has_value()) {
      e.value = *v;
      e.source = "env " + EnvName(name);
    }
  }
  for (auto& [name, e] : entries_) {
    if (absl::Status s = Validate(name, e); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status ConfigRegistry::LoadFromMain(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return Load(args, [](const std::string& key) -> std::optional<std::string> {
    const char* v = std::getenv(key.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  });
}

std::optional<int> ConfigRegistry::StartMain(int argc, char** argv, const std::function<absl::Status()>& validate,
                                             const std::string& failure_prefix) {
  auto fail = [&](const absl::Status& s) {
    std::cerr << program_ << ": " << failure_prefix << s.message() << "\n";
    return 2;
  };
  absl::Status loaded = LoadFromMain(argc, argv);
  if (help_requested_) {
    std::cout << Help();
    return 0;
  }
  if (version_requested_) {
    std::cout << VersionLine() << "\n";
    return 0;
  }
  if (!loaded.ok()) return fail(loaded);  // a bad value: nothing sensible to dump
  absl::Status valid = validate ? validate() : absl::OkStatus();
  if (dump_requested_) {
    std::cout << Dump();
    if (!valid.ok()) std::cerr << program_ << ": invalid configuration: " << valid.message() << "\n";
    return valid.ok() ? 0 : 2;
  }
  if (!valid.ok()) return fail(valid);
  return std::nullopt;
}

const ConfigRegistry::Entry& ConfigRegistry::Find(const std::string& name, Type type) const {
  auto it = entries_.find(name);
  DLCP_CHECK(it != entries_.end());
  DLCP_CHECK(it->second.type == type);
  return it->second;
}

const std::string& ConfigRegistry::GetString(const std::string& name) const { return Find(name, Type::kString).value; }
int64_t ConfigRegistry::GetInt(const std::string& name) const { return Find(name, Type::kInt).ivalue; }
double ConfigRegistry::GetDouble(const std::string& name) const { return Find(name, Type::kDouble).dvalue; }
bool ConfigRegistry::GetBool(const std::string& name) const { return Find(name, Type::kBool).bvalue; }

std::string ConfigRegistry::Dump() const {
  std::string out;
  for (const auto& [name, e] : entries_) {
    absl::StrAppend(&out, name, "=", e.value, "  # ", e.source, "\n");
  }
  return out;
}

std::string ConfigRegistry::VersionLine() const {
  return absl::StrCat(program_, " ", DLCP_VERSION, " (rdma: ", DLCP_WITH_RDMA ? "on" : "off",
                      ", cuda: ", DLCP_WITH_CUDA ? "on" : "off", ")");
}

std::string ConfigRegistry::Help() const {
  std::string out = absl::StrCat("usage: ", program_, " [--setting=value ...]\n");
  if (!summary_.empty()) absl::StrAppend(&out, summary_, "\n");
  absl::StrAppend(&out, "\nEvery setting may also come from the environment as DLCP_<NAME>; flags win.\n",
                  "  --dump-config  print every setting and where it came from, then exit\n",
                  "  --version      print the release and what it was built with, then exit\n\n");
  for (const auto& [name, e] : entries_) {
    absl::StrAppend(&out, "  --", name, " (", EnvName(name), ", default ", e.default_text, ")\n      ", e.help, "\n");
  }
  return out;
}

std::string ConfigRegistry::Markdown() const {
  std::string out = "| setting | environment | default | meaning |\n|---|---|---|---|\n";
  for (const auto& [name, e] : entries_) {
    std::string help = e.help;
    if (e.type == Type::kInt) absl::StrAppend(&help, "; ", e.imin, " to ", e.imax);
    if (e.type == Type::kDouble) absl::StrAppend(&help, "; ", e.dmin, " to ", e.dmax);
    absl::StrAppend(&out, "| `--", name, "` | `", EnvName(name), "` | ",
                    e.default_text.empty() ? "" : absl::StrCat("`", e.default_text, "`"), " | ",
                    absl::StrReplaceAll(help, {{"|", "\\|"}}), " |\n");
  }
  return out;
}

absl::Status ValidateHostPort(const std::string& value) { return SplitHostPort(value).status(); }

absl::Status ValidateHostPortList(const std::string& value) {
  if (value.empty()) return absl::InvalidArgumentError("expected HOST:PORT[,HOST:PORT...]");
  for (absl::string_view part : absl::StrSplit(value, ',')) {
    if (absl::Status s = ValidateHostPort(std::string(part)); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace dlcp
