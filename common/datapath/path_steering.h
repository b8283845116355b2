// Which send path (UDP source port, which ECMP hashes onto one path of the fabric) the next
// datagram to one peer leaves from, when paths may differ: each path has a congestion window of
// its own that follows only the losses of what was sent on it, and the paths take turns in
// proportion to those windows (smooth weighted round robin), in runs of `burst` datagrams. A
// path that loses gets a smaller share; its window grows back as its datagrams get through,
// which probes it again. The windows only share out what the peer's own window lets out.
//
// Single-threaded: owned by one I/O thread. Never blocks.
#pragma once

#include <cstdint>
#include <vector>

#include "common/datapath/congestion_window.h"
#include "common/datapath/weighted_turns.h"

namespace dlcp {

class PathSteering {
 public:
  // `paths` below 1 counts as 1.
  PathSteering(uint32_t paths, uint32_t burst, const CongestionOptions& options);

  // The path of the next datagram; the caller then reports OnSent with its stamp.
  uint32_t Pick();
  void OnSent(uint32_t path, uint64_t stamp) { windows_[path].OnSent(stamp); }
  void OnAcked(uint32_t path) { windows_[path].OnAcked(1); }
  void OnLoss(uint32_t path, uint64_t stamp) { windows_[path].OnLoss(stamp); }
  void OnLate(uint32_t path, uint64_t stamp) { windows_[path].OnLate(stamp); }

  uint32_t paths() const { return static_cast<uint32_t>(windows_.size()); }
  uint32_t weight(uint32_t path) const { return windows_[path].window(); }

 private:
  std::vector<CongestionWindow> windows_;
  WeightedTurns turns_;
  std::vector<double> weights_;  // Pick's scratch
};

}  // namespace dlcp
