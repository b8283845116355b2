// The loss bound of one bounded-loss round at one aggregator endpoint: which (worker, chunk)
// contributions are class 0 (must arrive) and which are droppable, how many of each are still
// missing, and what to ask for when the bound is not met yet.
//
// The bound is per endpoint (its shard of the tensor): if every shard loses at most ε of its
// droppable contributions, so does the whole tensor. Owned by one data thread; no locking.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/wire/bounded.h"
#include "common/wire/header.h"

namespace dlcp::server {

class LossTracker {
 public:
  LossTracker(uint32_t world, uint32_t chunk_count);

  // Applies one manifest part from `rank`. Parts may repeat and come in any order; a part that
  // contradicts an earlier one (another class, another total) is an error and changes nothing.
  absl::Status AddManifest(uint32_t rank, const wire::ManifestPart& part);
  // rank's contribution to chunk was summed (before or after its manifest arrived).
  void OnContribution(uint32_t rank, uint32_t chunk);
  // rank has pushed every chunk up to and including `chunk` here (it asked for their results).
  void MarkSentThrough(uint32_t rank, uint32_t chunk);

  bool manifests_complete() const { return manifests_missing_ == 0; }
  bool has_manifest(uint32_t rank) const { return owned_total_[rank] != 0 && owned_known_[rank] == owned_total_[rank]; }
  // The strictest ε any worker asked for, in ppm.
  uint32_t loss_bound_ppm() const { return ppm_; }
  uint32_t droppable_total() const { return droppable_total_; }
  uint32_t droppable_missing() const { return droppable_missing_; }
  uint32_t class0_missing() const { return class0_missing_; }
  uint32_t allowed_missing() const;
  // Every class-0 contribution is in and at most ε of the droppable ones are missing.
  bool BoundMet() const { return manifests_complete() && class0_missing_ == 0 && droppable_missing_ <= allowed_missing(); }
  bool AllIn() const { return manifests_complete() && class0_missing_ == 0 && droppable_missing_ == 0; }

  // What to NACK, per worker: every missing class-0 chunk, then only as many droppable chunks as
  // the bound requires, class 1 before 2 before 3. Within a class the picks go round the workers
  // starting at `rotate`, so no worker is always the one cut. Only chunks known lost count:
  // workers push in chunk order and each class has its own FIFO queue at the switch (strict
  // priority reorders across classes, never within one), so a chunk is lost once a later chunk
  // of the same class from the same worker has arrived, or the worker has asked about it. The
  // bound is applied to those: while no more are known lost than ε allows, nothing is asked for.
  // With fresh_only, chunks asked for by an earlier plan are not asked again (they count as
  // already requested): for repairs while the transfer runs, when a resend may still be coming.
  std::vector<std::vector<uint32_t>> RepairPlan(uint32_t rotate, bool fresh_only = false);

  // The class rank declared for chunk, or wire::kNotHere (also when its manifest is missing).
  uint8_t class_of(uint32_t rank, uint32_t chunk) const;
  bool got(uint32_t rank, uint32_t chunk) const { return cell(rank, chunk) & kGot; }
  // Declared by some worker: the chunk is this endpoint's, and gets a result when the round seals.
  bool owned(uint32_t chunk) const { return owned_[chunk]; }
  uint32_t world() const { return world_; }
  uint32_t chunk_count() const { return chunks_; }

 private:
  static constexpr uint8_t kGot = 0x80;
  static constexpr uint8_t kAsked = 0x40;  // in an earlier repair plan
  static constexpr uint8_t kUnknown = 0x3F;
  static constexpr uint8_t kClassMask = 0x3F;
  uint8_t& cell(uint32_t rank, uint32_t chunk) { return cells_[static_cast<size_t>(rank) * chunks_ + chunk]; }
  uint8_t cell(uint32_t rank, uint32_t chunk) const { return cells_[static_cast<size_t>(rank) * chunks_ + chunk]; }

  uint32_t world_, chunks_;
  std::vector<uint8_t> cells_;  // per (rank, chunk): got | asked | class (0..3, kNotHereCell, kUnknown)
  std::vector<bool> owned_;
  std::vector<uint32_t> owned_total_, owned_known_;
  // Per rank and class: 1 + the highest chunk of that class seen from it; and per rank, 1 + the
  // highest chunk it said it has pushed.
  std::vector<std::array<uint32_t, wire::kNumClasses>> class_frontier_;
  std::vector<uint32_t> sent_through_;
  void Advance(uint32_t rank, uint32_t chunk, uint8_t cls);
  uint32_t manifests_missing_;
  uint32_t ppm_ = wire::kPpm;
  uint32_t droppable_total_ = 0, droppable_missing_ = 0, class0_missing_ = 0;
};

}  // namespace dlcp::server
