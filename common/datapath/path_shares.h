// How a sender that hears of its losses only in batches shares its datagrams to one peer over its
// send paths (UDP source ports, which ECMP hashes onto paths of the fabric): dlcpd sending results
// to a worker. A worker sees its results come back and reads a loss within a round trip
// (path_steering.h); an aggregator hears of a lost result only when the worker asks for it again,
// a quiet spell after the loss, about once a round. So these shares follow each path's loss
// *rate* over whole batches (Update: everything sent before it has arrived or been reported lost),
// not single losses:
// - A path that lost a larger fraction of what it carried than all the paths together did loses
//   weight by the square of the ratio of their delivered fractions; one that lost less gains.
//   Shares settle where the paths lose alike: on a fabric with one slow path, where that path
//   carries what it can.
// - Every weight drifts back a little towards the largest each batch. That probes a path that
//   stopped losing, and keeps the shares level when nothing is lost.
// - Batches of fewer than kMinBatch datagrams per path are pooled with the next, so that a few
//   losses among a handful of datagrams do not swing the shares.
// The paths take turns in proportion to their weights (WeightedTurns), in runs of `burst`.
//
// Single-threaded: owned by one I/O thread. Never blocks.
#pragma once

#include <cstdint>
#include <vector>

#include "common/datapath/weighted_turns.h"

namespace dlcp {

class PathShares {
 public:
  static constexpr uint32_t kMinBatch = 16;  // datagrams per path, on average
  static constexpr double kMinWeight = 1.0 / 32;  // of the largest: every path is still probed
  static constexpr double kDrift = 0.03;  // of the gap to the largest weight, per batch

  PathShares(uint32_t paths, uint32_t burst);

  // The path of the next datagram; the caller then reports OnSent.
  uint32_t Pick() { return turns_.Pick(weights_); }
  void OnSent(uint32_t path) { ++sent_[path]; }
  // A datagram sent on `path` was lost (its peer asked for it again).
  void OnLost(uint32_t path) { ++lost_[path]; }
  // Everything sent so far has arrived or been reported lost: weigh the batch. Returns true if it
  // was large enough to change the weights.
  bool Update();

  uint32_t paths() const { return static_cast<uint32_t>(weights_.size()); }
  // Relative to the largest, which is 1.
  double weight(uint32_t path) const { return weights_[path]; }
  uint64_t updates() const { return updates_; }

 private:
  WeightedTurns turns_;
  std::vector<double> weights_;
  std::vector<uint64_t> sent_;
  std::vector<uint64_t> lost_;
  uint64_t updates_ = 0;
};

}  // namespace dlcp
