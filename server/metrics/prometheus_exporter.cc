#include "server/metrics/prometheus_exporter.h"

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>

#include <exception>

#include "absl/strings/str_cat.h"
#include "common/base/host_port.h"

namespace dlcp::server {
namespace {

class RegistryCollectable final : public prometheus::Collectable {
 public:
  explicit RegistryCollectable(MetricsRegistry* metrics) : metrics_(metrics) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out;
    for (const MetricsRegistry::Family& f : metrics_->Collect()) {
      prometheus::MetricFamily pf;
      pf.name = f.name;
      pf.help = f.help.empty() ? f.name : f.help;
      switch (f.kind) {
        case MetricsRegistry::Kind::kCounter: pf.type = prometheus::MetricType::Counter; break;
        case MetricsRegistry::Kind::kGauge: pf.type = prometheus::MetricType::Gauge; break;
        case MetricsRegistry::Kind::kHistogram: pf.type = prometheus::MetricType::Histogram; break;
      }
      for (const MetricsRegistry::Sample& s : f.samples) {
        prometheus::ClientMetric m;
        for (const auto& [k, v] : s.labels) m.label.push_back({k, v});
        if (s.histogram != nullptr) {
          const std::vector<uint64_t> counts = s.histogram->BucketCounts();
          uint64_t cumulative = 0;
          for (size_t i = 0; i < counts.size(); ++i) {
            cumulative += counts[i];
            double bound = i < s.histogram->bounds().size() ? s.histogram->bounds()[i]
                                                            : std::numeric_limits<double>::infinity();
            m.histogram.bucket.push_back({cumulative, bound});
          }
          m.histogram.sample_count = cumulative;
          m.histogram.sample_sum = s.histogram->sum();
        } else if (f.kind == MetricsRegistry::Kind::kGauge) {
          m.gauge.value = s.value;
        } else {
          m.counter.value = s.value;
        }
        pf.metric.push_back(std::move(m));
      }
      out.push_back(std::move(pf));
    }
    return out;
  }

 private:
  MetricsRegistry* metrics_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PrometheusExporter>> PrometheusExporter::Start(const std::string& host, uint16_t port,
                                                                               MetricsRegistry* metrics) {
  std::unique_ptr<PrometheusExporter> e(new PrometheusExporter());
  const std::string at = JoinHostPort(host, port);
  try {
    // civetweb (inside the exposer) throws when it cannot listen; nothing else here does.
    e->exposer_ = std::make_unique<prometheus::Exposer>(at, /*num_threads=*/1);
  } catch (const std::exception& ex) {
    return absl::UnavailableError(absl::StrCat("metrics endpoint ", at, ": ", ex.what()));
  }
  e->collectable_ = std::make_shared<RegistryCollectable>(metrics);
  e->exposer_->RegisterCollectable(e->collectable_);
  std::vector<int> ports = e->exposer_->GetListeningPorts();
  e->port_ = ports.empty() ? port : static_cast<uint16_t>(ports[0]);
  return e;
}

PrometheusExporter::~PrometheusExporter() = default;

}  // namespace dlcp::server
