// The one configuration registry: every setting of a binary is declared here with its type,
// default, bounds and help. Values come from flags over DLCP_* environment over defaults, and
// every value is validated before the program uses it. Not thread-safe while loading; read-only
// (and so safe from any thread) afterwards.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace dlcp {

class ConfigRegistry {
 public:
  // Checks a string value; returns a message saying what is wrong, or OK.
  using Validator = std::function<absl::Status(const std::string&)>;
  using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

  explicit ConfigRegistry(std::string program, std::string summary = "");

  void AddString(const std::string& name, std::string def, std::string help, Validator validator = nullptr);
  void AddInt(const std::string& name, int64_t def, int64_t min, int64_t max, std::string help);
  void AddDouble(const std::string& name, double def, double min, double max, std::string help);
  void AddBool(const std::string& name, bool def, std::string help);

  // Parses `--name=value`, `--name value`, `--flag` and `--no-flag`; then the environment
  // (DLCP_NAME with '-' as '_'); then validates every value. The error names the setting.
  absl::Status Load(const std::vector<std::string>& args, const EnvLookup& env);
  // The same with argv and the process environment.
  absl::Status LoadFromMain(int argc, char** argv);

  // What every binary's main does first: load argv and the environment; answer --help and
  // --version; for --dump-config print the values, then whether `validate` (cross-setting checks,
  // may be null) accepts them; otherwise report the first bad setting on stderr as "<program>: <prefix><why>".
  // Returns the exit code when main should return now (0, or 2 for bad configuration), else
  // nullopt to carry on.
  std::optional<int> StartMain(int argc, char** argv, const std::function<absl::Status()>& validate = nullptr,
                               const std::string& failure_prefix = "");

  const std::string& GetString(const std::string& name) const;
  int64_t GetInt(const std::string& name) const;
  double GetDouble(const std::string& name) const;
  bool GetBool(const std::string& name) const;

  bool help_requested() const { return help_requested_; }
  bool dump_requested() const { return dump_requested_; }
  const std::vector<std::string>& positional() const { return positional_; }

  // One `name=value  # source` line per setting, sorted by name.
  std::string Dump() const;
  std::string Help() const;
  // The settings as a Markdown table (docs/deploy.md's, checked by tests/unit/settings_tables_test.cc).
  std::string Markdown() const;
  // "<program> <release> (rdma: on|off, cuda: on|off)": what --version prints.
  std::string VersionLine() const;
  static std::string EnvName(const std::string& name);

 private:
  enum class Type { kString, kInt, kDouble, kBool };
  struct Entry {
    Type type;
    std::string help;
    std::string default_text;
    std::string value;
    std::string source = "default";
    int64_t imin = 0, imax = 0;
    double dmin = 0, dmax = 0;
    Validator validator;
    int64_t ivalue = 0;
    double dvalue = 0;
    bool bvalue = false;
  };
  void Add(const std::string& name, Entry e);
  absl::Status Set(const std::string& name, const std::string& value, const std::string& source);
  absl::Status Validate(const std::string& name, Entry& e);
  const Entry& Find(const std::string& name, Type type) const;

  std::string program_;
  std::string summary_;
  std::map<std::string, Entry> entries_;
  std::vector<std::string> positional_;
  bool help_requested_ = false;
  bool version_requested_ = false;
  bool dump_requested_ = false;
};

// Validators shared by the binaries.
absl::Status ValidateHostPort(const std::string& value);
absl::Status ValidateHostPortList(const std::string& value);

}  // namespace dlcp
