#include "common/metrics/registry.h"

#include <algorithm>
#include <cmath>

namespace dlcp {

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), buckets_(new std::atomic<uint64_t>[bounds_.size() + 1]) {
  std::sort(bounds_.begin(), bounds_.end());
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double v) {
  size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_micros_.fetch_add(static_cast<uint64_t>(std::max(0.0, v) * 1e6), std::memory_order_relaxed);
}

double Histogram::sum() const { return static_cast<double>(sum_micros_.load(std::memory_order_relaxed)) / 1e6; }

std::vector<uint64_t> Histogram::BucketCounts() const {
  std::vector<uint64_t> out(bounds_.size() + 1);
  for (size_t i = 0; i < out.size(); ++i) out[i] = buckets_[i].load(std::memory_order_relaxed);
  return out;
}

double Histogram::Quantile(double q) const {
  std::vector<uint64_t> counts = BucketCounts();
  uint64_t total = 0;
  for (uint64_t c : counts) total += c;
  if (total == 0) return 0;
  uint64_t rank = static_cast<uint64_t>(std::ceil(q * static_cast<double>(total)));
  uint64_t seen = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    seen += counts[i];
    if (seen >= rank) return i < bounds_.size() ? bounds_[i] : INFINITY;
  }
  return INFINITY;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> out;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) out.push_back(v);
  return out;
}

std::string MetricsRegistry::Key(const std::string& name, const Labels& labels) {
  if (labels.empty()) return name;
  std::string out = name + "{";
  bool first = true;
  for (const auto& [k, v] : labels) {
    out += (first ? "" : ",") + k + "=\"" + v + "\"";
    first = false;
  }
  return out + "}";
}

void MetricsRegistry::Describe(const std::string& name, Kind kind, const std::string& help) {
  auto [it, fresh] = meta_.try_emplace(name, Meta{help, kind});
  if (!fresh && it->second.help.empty()) it->second.help = help;
}

Counter* MetricsRegistry::GetCounter(const std::string& name, const Labels& labels, const std::string& help) {
  std::lock_guard<std::mutex> lock(mu_);
  Describe(name, Kind::kCounter, help);
  auto& slot = counters_[{name, labels}];
  if (!slot) slot = std::make_unique<Counter>();
  return slot.get();
}

Histogram* MetricsRegistry::GetHistogram(const std::string& name, const std::vector<double>& bounds,
                                         const std::string& help) {
  std::lock_guard<std::mutex> lock(mu_);
  Describe(name, Kind::kHistogram, help);
  auto& slot = histograms_[name];
  if (!slot) slot = std::make_unique<Histogram>(bounds);
  return slot.get();
}

void MetricsRegistry::AddComputed(const std::string& name, const Labels& labels, Kind kind, const std::string& help,
                                  std::function<double()> value) {
  std::lock_guard<std::mutex> lock(mu_);
  Describe(name, kind, help);
  computed_[{name, labels}] = std::move(value);
}

void MetricsRegistry::AddComputedSamples(const std::string& name, Kind kind, const std::string& help,
                                         std::function<std::vector<Sample>()> samples) {
  std::lock_guard<std::mutex> lock(mu_);
  Describe(name, kind, help);
  computed_samples_[name] = std::move(samples);
}

std::map<std::string, double> MetricsRegistry::Snapshot() const {
  std::map<std::string, double> out;
  for (const Family& f : Collect()) {
    for (const Sample& s : f.samples) {
      if (s.histogram == nullptr) {
        out[Key(f.name, s.labels)] = s.value;
        continue;
      }
      out[f.name + "_count"] = static_cast<double>(s.histogram->count());
      out[f.name + "_sum"] = s.histogram->sum();
      out[f.name + "_p50"] = s.histogram->Quantile(0.5);
      out[f.name + "_p99"] = s.histogram->Quantile(0.99);
    }
  }
  return out;
}

std::vector<MetricsRegistry::Family> MetricsRegistry::Collect() const {
  std::map<std::string, Family> by_name;
  std::vector<std::pair<std::pair<std::string, Labels>, std::function<double()>>> computed;
  std::vector<std::pair<std::string, std::function<std::vector<Sample>()>>> computed_samples;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [name, meta] : meta_) by_name[name] = Family{name, meta.help, meta.kind, {}};
    for (const auto& [key, c] : counters_) {
      by_name[key.first].samples.push_back({key.second, static_cast<double>(c->value()), nullptr});
    }
    for (const auto& [name, h] : histograms_) by_name[name].samples.push_back({{}, 0, h.get()});
    computed.assign(computed_.begin(), computed_.end());
    computed_samples.assign(computed_samples_.begin(), computed_samples_.end());
  }
  // Computed values are read outside the lock: they may take other locks of their own.
  for (const auto& [key, fn] : computed) by_name[key.first].samples.push_back({key.second, fn(), nullptr});
  for (const auto& [name, fn] : computed_samples) {
    for (Sample& s : fn()) by_name[name].samples.push_back({std::move(s.labels), s.value, nullptr});
  }
  std::vector<Family> out;
  for (auto& [name, f] : by_name) out.push_back(std::move(f));
  return out;
}

}  // namespace dlcp
