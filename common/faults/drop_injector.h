// Deterministic packet loss for tests and benchmarks: per-class drop rates, optionally in bursts
// (microbursts take out runs of consecutive packets, which is what a full drop-tail queue does).
// The same seed gives the same drops. Owned by one thread; not thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <random>
#include <string>

#include "absl/status/statusor.h"
#include "common/wire/header.h"

namespace dlcp {

struct DropInjectorOptions {
  std::array<double, wire::kNumClasses> rate = {};  // long-run fraction dropped, per class
  uint32_t burst = 1;                               // packets per drop event
  uint64_t seed = 1;
  bool enabled() const { return rate[0] > 0 || rate[1] > 0 || rate[2] > 0 || rate[3] > 0; }
};

// "C:P[,C:P...]", e.g. "1:0.05,3:0.2"; classes not named keep their rate in `out`.
absl::Status ParseClassDrops(const std::string& text, std::array<double, wire::kNumClasses>* out);
std::string FormatClassDrops(const std::array<double, wire::kNumClasses>& rates);

class DropInjector {
 public:
  explicit DropInjector(const DropInjectorOptions& options);
  bool Drop(uint8_t cls);
  uint64_t dropped() const { return dropped_; }

 private:
  DropInjectorOptions options_;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> uniform_{0.0, 1.0};
  std::array<uint32_t, wire::kNumClasses> burst_left_ = {};
  uint64_t dropped_ = 0;
};

}  // namespace dlcp
