// Phase-aware tolerance (optional): SGD is most sensitive to lost gradient data in critical
// phases, when the gradient is changing fast, and tolerant in between. Outside critical phases ε
// rises to `relax` times the configured bound; a phase is critical when a tensor's gradient L2
// norm changes by `threshold` (50%) or more from one round to the next, and stays critical for
// `hold` rounds after the last such change.
//
// Threading: one instance per client I/O thread; not thread-safe.
#pragma once

#include <cstdint>
#include <unordered_map>

namespace dlcp {

struct PhaseAwareOptions {
  bool enabled = false;
  double relax = 2.0;
  double threshold = 0.5;
  uint32_t hold = 5;
};

class PhaseAwareBound {
 public:
  explicit PhaseAwareBound(const PhaseAwareOptions& options) : options_(options) {}
  // The bound for this round of `key`, given the configured one and the tensor's L2 norm now.
  double Next(uint32_t key, double base, double norm);
  bool critical(uint32_t key) const;

 private:
  struct State {
    double last_norm = -1;
    uint32_t hold_left = 0;
  };
  PhaseAwareOptions options_;
  std::unordered_map<uint32_t, State> state_;
};

}  // namespace dlcp
