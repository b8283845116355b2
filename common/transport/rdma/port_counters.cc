#include "common/transport/rdma/port_counters.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace dlcp {
namespace {

std::filesystem::path CountersDir(const std::string& sysfs_root, const std::string& device, uint32_t port) {
  return std::filesystem::path(sysfs_root) / "class" / "infiniband" / device / "ports" / std::to_string(port) /
         "hw_counters";
}

absl::StatusOr<uint64_t> ReadCounterFile(const std::filesystem::path& path) {
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  std::string text;
  std::getline(f, text);
  uint64_t value = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &value)) {
    return absl::DataLossError(absl::StrCat(path.string(), " holds '", text, "', not a count"));
  }
  return value;
}

}  // namespace

absl::StatusOr<std::vector<PortCounter>> ReadPortCounters(const std::string& sysfs_root, const std::string& device,
                                                          uint32_t port) {
  const std::filesystem::path dir = CountersDir(sysfs_root, device, port);
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) return absl::NotFoundError(absl::StrCat(dir.string(), ": ", ec.message()));
  std::vector<PortCounter> out;
  for (const std::filesystem::directory_entry& e : it) {
    const std::string name = e.path().filename().string();
    if (name == "lifespan" || !e.is_regular_file(ec)) continue;
    absl::StatusOr<uint64_t> v = ReadCounterFile(e.path());
    if (!v.ok()) return v.status();
    out.push_back({name, *v});
  }
  if (out.empty()) return absl::NotFoundError(absl::StrCat(dir.string(), " holds no counters"));
  std::sort(out.begin(), out.end(), [](const PortCounter& a, const PortCounter& b) { return a.name < b.name; });
  return out;
}

absl::StatusOr<uint64_t> ReadPortCounter(const std::string& sysfs_root, const std::string& device, uint32_t port,
                                         const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' is no counter name"));
  }
  return ReadCounterFile(CountersDir(sysfs_root, device, port) / name);
}

}  // namespace dlcp
