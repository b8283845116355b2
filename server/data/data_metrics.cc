#include "server/data/data_metrics.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace dlcp::server {

DataMetrics DataMetrics::Make(MetricsRegistry* registry) {
  DataMetrics m;
  static const char* kTypeNames[] = {"",      "push",  "result",   "push_nack", "result_req",
                                     "probe", "error", "manifest", "stop"};
  static_assert(sizeof(kTypeNames) / sizeof(kTypeNames[0]) == wire::kMaxMsgType + 1);
  for (uint8_t c = 0; c < wire::kNumClasses; ++c) {
    const std::string cls = absl::StrCat(c);
    for (uint8_t t = 1; t <= wire::kMaxMsgType; ++t) {
      m.rx_packets[t][c] = registry->GetCounter("dlcp_rx_packets_total", {{"type", kTypeNames[t]}, {"class", cls}},
                                                "Valid data-plane packets received, by message type and class");
      m.tx_packets[t][c] = registry->GetCounter("dlcp_tx_packets_total", {{"type", kTypeNames[t]}, {"class", cls}},
                                                "Data-plane packets sent, by message type and class");
    }
    m.rx_bytes[c] = registry->GetCounter("dlcp_rx_bytes_total", {{"class", cls}}, "Bytes of valid packets received");
    for (int out = 0; out < 2; ++out) {
      m.contributions[c][out] = registry->GetCounter(
          "dlcp_contributions_total", {{"class", cls}, {"outcome", out ? "left_out" : "summed"}},
          "Worker contributions to bounded-loss rounds at seal time, by the class the worker gave them");
    }
    m.tx_bytes[c] = registry->GetCounter("dlcp_tx_bytes_total", {{"class", cls}}, "Bytes of packets sent");
  }
  const std::string repairs_help = "Repair actions: NACKs and probes sent, results and STOPs sent again on request";
  m.push_nacks = registry->GetCounter("dlcp_repairs_total", {{"kind", "push_nack"}}, repairs_help);
  m.probes = registry->GetCounter("dlcp_repairs_total", {{"kind", "probe"}}, repairs_help);
  m.results_resent = registry->GetCounter("dlcp_repairs_total", {{"kind", "result_resent"}}, repairs_help);
  m.results_in_flight = registry->GetCounter("dlcp_results_not_resent_total", {},
                                             "Results asked for again within a repair interval of their last copy, not "
                                             "sent again: that copy may still arrive");
  m.result_share_updates = registry->GetCounter(
      "dlcp_result_share_updates_total", {},
      "Times the shares of results to one worker over the spray paths were weighed again from their losses");
  m.stops_resent = registry->GetCounter("dlcp_repairs_total", {{"kind", "stop_resent"}}, repairs_help);
  m.push_duplicate = registry->GetCounter("dlcp_push_duplicates_total", {}, "Pushes already summed, ignored");
  m.stale = registry->GetCounter("dlcp_stale_packets_total", {}, "Packets for rounds already delivered and released");
  m.inject_dropped = registry->GetCounter("dlcp_inject_dropped_total", {}, "Packets discarded by --inject-drop*");
  m.push_sealed = registry->GetCounter("dlcp_push_after_seal_total", {},
                                       "Pushes that reached a bounded-loss round after it sealed, not summed");
  m.loss_ratio = registry->GetHistogram(
      "dlcp_round_loss_ratio", {0, 0.0001, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1},
      "Per bounded-loss round and endpoint: droppable contributions left out over those declared");
  m.stop_seconds = registry->GetHistogram("dlcp_time_to_stop_seconds", ExponentialBuckets(0.000125, 2, 20),
                                     "Bounded-loss rounds: time from the first packet to STOP");
  m.tail_wait_seconds = registry->GetHistogram(
      "dlcp_tail_wait_seconds", {0, 0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1},
      "Bounded-loss rounds: time from the loss bound being met to STOP");
  m.tail_wait_ratio = registry->GetHistogram("dlcp_tail_wait_ratio", {0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1},
                                             "Bounded-loss rounds: the tail wait over the time to STOP");
  const std::string rounds_help = "Rounds released, by outcome";
  m.rounds_completed = registry->GetCounter("dlcp_rounds_total", {{"outcome", "completed"}}, rounds_help);
  m.rounds_expired = registry->GetCounter("dlcp_rounds_total", {{"outcome", "expired"}}, rounds_help);
  m.rounds_aborted = registry->GetCounter("dlcp_rounds_total", {{"outcome", "aborted"}}, rounds_help);
  m.send_errors = registry->GetCounter("dlcp_send_errors_total", {}, "Failed sends on the data plane");
  for (size_t i = 1; i < static_cast<size_t>(wire::Reject::kCount); ++i) {
    m.rejects[i] =
        registry->GetCounter("dlcp_rejects_total", {{"reason", wire::RejectName(static_cast<wire::Reject>(i))}},
                             "Invalid packets dropped, by reason");
  }
  m.round_seconds = registry->GetHistogram("dlcp_round_duration_seconds", ExponentialBuckets(0.000125, 2, 20),
                                      "Time from a round's first push to its last contribution, per data thread");
  return m;
}

}  // namespace dlcp::server
