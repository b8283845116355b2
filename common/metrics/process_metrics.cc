#include "common/metrics/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace dlcp {
namespace {

// The fields of /proc/self/stat after the command name (field 3 on), which may hold spaces.
std::vector<std::string> StatFields() {
  std::ifstream f("/proc/self/stat");
  std::string line;
  std::getline(f, line);
  const size_t end = line.rfind(')');
  std::vector<std::string> fields;
  if (end == std::string::npos) return fields;
  std::istringstream rest(line.substr(end + 2));
  for (std::string field; rest >> field;) fields.push_back(field);
  return fields;
}

// Field `n` of /proc/self/stat as proc(5) numbers them (1-based; 3 is the state), or 0.
double StatField(int n) {
  const std::vector<std::string> fields = StatFields();
  const size_t i = static_cast<size_t>(n - 3);
  return i < fields.size() ? std::stod(fields[i]) : 0;
}

double BootTimeSeconds() {
  std::ifstream f("/proc/stat");
  for (std::string key; f >> key;) {
    if (key == "btime") {
      double t = 0;
      f >> t;
      return t;
    }
  }
  return 0;
}

double OpenFds() {
  double n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
  }
  return n - 1;  // less the directory's own descriptor
}

}  // namespace

void ExportProcessMetrics(MetricsRegistry* metrics) {
  using K = MetricsRegistry::Kind;
  const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(::sysconf(_SC_PAGESIZE));
  metrics->AddComputed("process_cpu_seconds_total", {}, K::kCounter, "User and system CPU time spent, in seconds",
                       [ticks] { return (StatField(14) + StatField(15)) / ticks; });
  metrics->AddComputed("process_resident_memory_bytes", {}, K::kGauge, "Resident memory, in bytes",
                       [page] { return StatField(24) * page; });
  metrics->AddComputed("process_threads", {}, K::kGauge, "Threads", [] { return StatField(20); });
  metrics->AddComputed("process_open_fds", {}, K::kGauge, "Open file descriptors", [] { return OpenFds(); });
  metrics->AddComputed("process_max_fds", {}, K::kGauge, "The open file descriptor limit", [] {
    rlimit r{};
    return ::getrlimit(RLIMIT_NOFILE, &r) == 0 ? static_cast<double>(r.rlim_cur) : 0.0;
  });
  const double start = BootTimeSeconds() + StatField(22) / ticks;
  metrics->AddComputed("process_start_time_seconds", {}, K::kGauge, "Start time since the Unix epoch, in seconds",
                       [start] { return start; });
}

}  // namespace dlcp
