// How a sender that hears of its losses only in batches shares its datagrams to one peer over its
// send paths (UDP source ports, which ECMP hashes onto paths of the fabric): dlcpd sending results
// to a worker. A worker sees its results come back and reads a loss within a round trip
// (path_steering.h); an aggregator hears of a lost result only when the worker asks for it again,
// a quiet spell after the loss, about once a round. So these shares follow each path's loss
// *rate* over whole batches (Update: everything sent before it has arrived or been reported lost),
// not single losses:
// - A path that lost a larger fraction of what it carried than all the paths together did loses
//   weight by the ratio of their delivered fractions to the power `gain`, but at most by half in
//   one batch; one that lost less gains. Shares settle where the paths lose alike: on a fabric
//   with one slow path, where that path carries what it can.
// - The gain adapts, as in resilient backpropagation. It starts at kMaxGain, doubles (up to
//   kMaxGain) while successive lossy batches agree about which paths lose (the cosine of their
//   steps above kAgree), and halves (down to kMinGain) when they contradict each other (below
//   -kAgree). A path that delivered next to nothing falls to the floor at once, uncapped.
// - Why: where a path's losses are its whole excess (a sender that does not slow down), a gain
//   of 1 would fit its share to what it carried in one batch, and a larger one overshoots, so the
//   next batch blames the other paths and the gain falls. But results are clocked by the workers' pushes,
//   which their windows slow down: an overrun path's queue mostly stretches the round, and its
//   losses understate the excess many times over (a few percent of what a path at half rate
//   carried in equal turns, on the two-spine bed). With a fixed gain of 2 the shares took about
//   8 rounds to settle there, and every job's first rounds were its slowest. Halving at any
//   disagreement (a cosine below 0) kept the gain near its floor there: with 16 paths and a loss
//   or two on each per batch, which of the slow paths lose changes from batch to batch.
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
  static constexpr double kMinGain = 2;
  static constexpr double kMaxGain = 16;
  static constexpr double kAgree = 0.5;  // the cosine of successive steps that raises the gain
  static constexpr double kMaxCut = 0.5;  // the most a path's weight falls in one batch

  // `paths` below 1 counts as 1.
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
  double gain() const { return gain_; }

 private:
  WeightedTurns turns_;
  std::vector<double> weights_;
  std::vector<uint64_t> sent_;
  std::vector<uint64_t> lost_;
  uint64_t updates_ = 0;
  double gain_ = kMaxGain;
  std::vector<double> last_step_;  // of the last batch that lost anything; empty before it

  void AdaptGain(const std::vector<double>& step);
};

}  // namespace dlcp
