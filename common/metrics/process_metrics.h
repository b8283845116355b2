// The process's own figures under Prometheus's standard names, read from /proc/self when the
// registry is collected: process_cpu_seconds_total, process_resident_memory_bytes,
// process_open_fds, process_max_fds, process_threads, process_start_time_seconds. Linux only.
#pragma once

#include "common/metrics/registry.h"

namespace dlcp {

void ExportProcessMetrics(MetricsRegistry* metrics);

}  // namespace dlcp
