// The metrics a data thread updates on its hot path, looked up once in the registry (names and
// labels are created there) so that counting is a pointer away. Every data thread of a dlcpd
// shares the same series; the registry sums nothing twice.
#pragma once

#include <cstddef>

#include "common/metrics/registry.h"
#include "common/wire/header.h"

namespace dlcp::server {

struct DataMetrics {
  // Per message type (index: wire::MsgType value) and priority class.
  Counter* rx_packets[wire::kMaxMsgType + 1][wire::kNumClasses] = {};
  Counter* tx_packets[wire::kMaxMsgType + 1][wire::kNumClasses] = {};
  Counter* rx_bytes[wire::kNumClasses] = {};
  Counter* tx_bytes[wire::kNumClasses] = {};
  Counter* results_resent = nullptr;
  Counter* results_in_flight = nullptr;
  Counter* result_share_updates = nullptr;
  Counter* stops_resent = nullptr;
  Counter* push_nacks = nullptr;
  Counter* probes = nullptr;
  Counter* push_duplicate = nullptr;
  Counter* stale = nullptr;
  Counter* inject_dropped = nullptr;
  Counter* push_sealed = nullptr;
  Counter* contributions[wire::kNumClasses][2] = {};  // [class][left out]
  Histogram* loss_ratio = nullptr;
  Histogram* stop_seconds = nullptr;
  Histogram* tail_wait_seconds = nullptr;
  Histogram* tail_wait_ratio = nullptr;
  Counter* rounds_completed = nullptr;
  Counter* rounds_expired = nullptr;
  Counter* rounds_aborted = nullptr;
  Counter* send_errors = nullptr;
  Counter* rejects[static_cast<size_t>(wire::Reject::kCount)] = {};
  Histogram* round_seconds = nullptr;

  // Registers (or finds) every series in `registry`, which outlives the struct.
  static DataMetrics Make(MetricsRegistry* registry);
};

}  // namespace dlcp::server
