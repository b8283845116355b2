// The one timing rule of the data plane, shared by aggregators (when a round's tail ends, and
// when missing pushes are asked for) and clients (when the bounded pull's tail ends, and when a
// full window counts as stalled): wait for a quiet spell of a few of the transfer's own mean
// gaps between arrivals.
// The wait follows the pace the transfer is actually getting: no fixed sleeps, and no history
// of other rounds that may have run under other load.
#pragma once

#include <algorithm>
#include <cstdint>

#include "absl/time/time.h"

namespace dlcp {

// `arrivals` arrived between `start` and `last`: the spell ends at last + gaps × their mean gap,
// clamped to [floor, cap].
inline absl::Time QuietSpellEnd(absl::Time start, absl::Time last, uint64_t arrivals, double gaps,
                                absl::Duration floor, absl::Duration cap) {
  const absl::Duration gap = (last - start) / static_cast<double>(std::max<uint64_t>(1, arrivals));
  return last + std::clamp(gap * gaps, floor, std::max(floor, cap));
}

// A tail ends after 8 mean gaps of quiet, at least 200 µs.
inline constexpr double kTailGaps = 8;
inline constexpr absl::Duration kMinTail = absl::Microseconds(200);

// A transfer slower than the caps above were tuned for (results hundreds of microseconds or more
// apart: a slow link, or a deep queue that drains slowly) still gets `gaps` of its own mean gap
// before it counts as silent. Otherwise the cap cuts the spell short of the gaps it normally has
// between arrivals: on 10 Mbit/s spines, workers asked again for results still on their way,
// and 40% of the results an aggregator sent were copies; aggregators NACKed pushes still on
// theirs, up to almost 4 times as many as were lost (docs/congestion.md, "Slow paths").
// The mean is over the gaps since the first arrival (the wait for the first is latency, not
// pace), once kPacedMinArrivals have come; at most kMaxPacedQuiet; zero before.
inline constexpr uint64_t kPacedMinArrivals = 16;
inline constexpr absl::Duration kMaxPacedQuiet = absl::Milliseconds(100);
inline absl::Duration PacedQuiet(absl::Time first, absl::Time last, uint64_t arrivals, double gaps) {
  if (arrivals < kPacedMinArrivals) return absl::ZeroDuration();
  return std::min((last - first) / static_cast<double>(arrivals - 1) * gaps, kMaxPacedQuiet);
}

// An aggregator asks for missing pushes after 16 mean gaps of quiet, at least 1 ms (scheduling
// jitter on a busy node) and at most the configured repair timeout, unless PacedQuiet says
// longer. A fixed timeout was the tail of congested rounds: at 20 ms, then still at 5 ms
// (docs/measurements/bounded-loss.md).
inline constexpr double kRepairGaps = 16;
inline constexpr absl::Duration kMinRepair = absl::Milliseconds(1);

// The silence after `last` that counts as loss, for aggregators (missing pushes) and workers
// (missing results) alike: `arrivals` came since `start`, the first of them at `first`.
inline absl::Duration RepairQuiet(absl::Time start, absl::Time first, absl::Time last, uint64_t arrivals,
                                  absl::Duration cap) {
  return std::max(QuietSpellEnd(start, last, arrivals, kRepairGaps, kMinRepair, cap) - last,
                  PacedQuiet(first, last, arrivals, kRepairGaps));
}

}  // namespace dlcp
