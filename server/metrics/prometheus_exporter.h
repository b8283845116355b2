// Serves a MetricsRegistry in the Prometheus text format over HTTP (prometheus-cpp's exposer),
// read live at every scrape, so the registry stays the one source of every figure. The exposer
// runs its own threads; the registry must outlive the exporter.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics/registry.h"

namespace prometheus {
class Exposer;
class Collectable;
}  // namespace prometheus

namespace dlcp::server {

class PrometheusExporter {
 public:
  // Listens on host:port (port 0 picks a free one) and serves /metrics.
  static absl::StatusOr<std::unique_ptr<PrometheusExporter>> Start(const std::string& host, uint16_t port,
                                                                   MetricsRegistry* metrics);
  ~PrometheusExporter();
  uint16_t port() const { return port_; }

 private:
  PrometheusExporter() = default;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<prometheus::Collectable> collectable_;
  uint16_t port_ = 0;
};

}  // namespace dlcp::server
