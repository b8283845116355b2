#include "common/classes/phase_aware.h"

#include <algorithm>
#include <cmath>

namespace dlcp {

double PhaseAwareBound::Next(uint32_t key, double base, double norm) {
  State& s = state_[key];
  const bool first = s.last_norm < 0;
  const double change = first ? 0 : std::fabs(norm - s.last_norm) / std::max(s.last_norm, 1e-30);
  s.last_norm = norm;
  // The first round has nothing to compare with; treat it as critical (training has just begun).
  if (first || !std::isfinite(change) || change >= options_.threshold) {
    s.hold_left = options_.hold;
  } else if (s.hold_left > 0) {
    --s.hold_left;
  }
  return s.hold_left > 0 ? base : std::min(1.0, base * options_.relax);
}

bool PhaseAwareBound::critical(uint32_t key) const {
  auto it = state_.find(key);
  return it == state_.end() || it->second.hold_left > 0;
}

}  // namespace dlcp
