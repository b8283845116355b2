// Whether the path to one peer is queueing: the round trips of its datagrams lately, against the
// least they took over a longer span. A sender asks it when a datagram is lost, to tell a loss
// that overran a queue (congestion: back off) from one that did not (a flaky link, a lossy WAN,
// injected loss: backing off only slows the round, and the next loss is as likely as before).
//
// Why round trips: a queue that fills delays every datagram behind it before it drops any, so a
// loss at a full queue comes with round trips well above the path's least; a random loss comes
// with round trips where they were. TCP Veno and CDG read losses the same way. A round trip here
// spans a push and its result, and a result waits for every worker's push of its chunk, so a
// sample also holds how far this worker ran ahead of the slowest. Both the recent and the base
// value are minimums, which keeps the lucky samples (the chunks nobody was behind on) and so the
// queue the path holds, not the skew between workers.
//
// The round trip is "raised" once the least of the last `recent` samples exceeds the least over
// the last `base_span` by more than max(floor, ratio × base). Until `recent` samples came, it
// knows nothing and says raised: the sender backs off as it would without this signal.
// docs/congestion.md has the thresholds and the measurements behind them.
//
// Single-threaded: owned by one I/O thread. Never blocks.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/time/time.h"

namespace dlcp {

struct DelaySignalOptions {
  absl::Duration floor = absl::Microseconds(700);
  double ratio = 1.0;
  size_t recent = 16;  // samples the recent minimum is taken over
  // How long the base is remembered. A longer span keeps a standing queue visible; a shorter one
  // follows a path that got longer (a remap, a route change) sooner.
  absl::Duration base_span = absl::Seconds(10);
  // Send times kept, indexed by stamp: at least the most datagrams ever in flight, or answers to
  // the oldest make no sample.
  size_t capacity = 4096;
};

class DelaySignal {
 public:
  explicit DelaySignal(const DelaySignalOptions& options = {});

  // The datagram stamped `stamp` (increasing, as CongestionWindow::Stamp) left at `now`.
  void OnSent(uint64_t stamp, absl::Time now);
  // Its answer came at `now`. Only answers that say how long the path took belong here: not one
  // to a datagram sent again (which copy does it answer?), nor one that waited for a repair.
  void OnAnswered(uint64_t stamp, absl::Time now);
  // Whether round trips now stand above the path's base by more than the threshold; true while
  // there are too few samples to tell.
  bool Raised() const;

  // For tests and stats: the recent and base minimums (InfiniteDuration before any sample).
  absl::Duration recent() const;
  absl::Duration base() const;

 private:
  struct Sent {
    uint64_t stamp = 0;
    absl::Time at;
  };
  DelaySignalOptions options_;
  std::vector<Sent> sent_;  // a ring, by stamp modulo its size
  std::vector<absl::Duration> recent_;  // a ring of the last samples
  size_t samples_ = 0;
  // The base: the minimum of each quarter of base_span, the oldest overwritten as time passes.
  std::array<absl::Duration, 4> base_quarters_;
  absl::Time quarter_start_ = absl::InfinitePast();
  size_t quarter_ = 0;
};

}  // namespace dlcp
