// Process metrics: named, labelled counters and histograms, plus computed metrics read at
// collection time. Get* may be called from any thread and returns a pointer that stays valid for
// the registry's lifetime; hot paths look a metric up once and keep the pointer. Updates are
// lock-free atomics. Names follow Prometheus conventions (counters end in _total).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dlcp {

using Labels = std::map<std::string, std::string>;

class Counter {
 public:
  void Add(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double v);
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  double sum() const;
  // Upper bound of the bucket holding quantile q; an estimate, like Prometheus' histogram_quantile.
  double Quantile(double q) const;
  const std::vector<double>& bounds() const { return bounds_; }
  // Per bucket (not cumulative), the last one for values above every bound.
  std::vector<uint64_t> BucketCounts() const;

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1 (overflow)
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_micros_{0};
};

// Exponential bucket bounds: start, start*factor, ... (count of them).
std::vector<double> ExponentialBuckets(double start, double factor, int count);

class MetricsRegistry {
 public:
  enum class Kind { kCounter, kGauge, kHistogram };

  Counter* GetCounter(const std::string& name, const Labels& labels = {}, const std::string& help = "");
  Histogram* GetHistogram(const std::string& name, const std::vector<double>& bounds, const std::string& help = "");
  // A metric whose value is computed when collected (e.g. live jobs, transport counters).
  void AddComputed(const std::string& name, const Labels& labels, Kind kind, const std::string& help,
                   std::function<double()> value);

  // Flat view for GetStats and dlcpctl: `name{label="v",...}` -> value; histograms as
  // name_count, name_sum, name_p50 and name_p99.
  std::map<std::string, double> Snapshot() const;

  // Structured view for exporters, grouped by metric name.
  struct Sample {
    Labels labels;
    double value = 0;
    const Histogram* histogram = nullptr;
  };
  struct Family {
    std::string name;
    std::string help;
    Kind kind = Kind::kCounter;
    std::vector<Sample> samples;
  };
  // A metric whose label sets, as well as values, are computed when collected (e.g. one sample
  // per slow rank of each job). The function returns plain samples (no histograms).
  void AddComputedSamples(const std::string& name, Kind kind, const std::string& help,
                          std::function<std::vector<Sample>()> samples);
  std::vector<Family> Collect() const;

  static std::string Key(const std::string& name, const Labels& labels);

 private:
  struct Meta {
    std::string help;
    Kind kind;
  };
  void Describe(const std::string& name, Kind kind, const std::string& help);

  mutable std::mutex mu_;
  std::map<std::string, Meta> meta_;
  std::map<std::pair<std::string, Labels>, std::unique_ptr<Counter>> counters_;
  std::map<std::string, std::unique_ptr<Histogram>> histograms_;
  std::map<std::pair<std::string, Labels>, std::function<double()>> computed_;
  std::map<std::string, std::function<std::vector<Sample>()>> computed_samples_;
};

}  // namespace dlcp
