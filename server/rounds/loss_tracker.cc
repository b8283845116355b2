#include "server/rounds/loss_tracker.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace dlcp::server {
namespace {
constexpr uint8_t kNotHereCell = 0x3E;
}  // namespace

LossTracker::LossTracker(uint32_t world, uint32_t chunk_count)
    : world_(world),
      chunks_(chunk_count),
      cells_(static_cast<size_t>(world) * chunk_count, kUnknown),
      owned_(chunk_count, false),
      owned_total_(world, 0),
      owned_known_(world, 0),
      class_frontier_(world, std::array<uint32_t, wire::kNumClasses>{}),
      sent_through_(world, 0),
      manifests_missing_(world) {}

uint32_t LossTracker::allowed_missing() const {
  return static_cast<uint32_t>(static_cast<uint64_t>(ppm_) * droppable_total_ / wire::kPpm);
}

absl::Status LossTracker::AddManifest(uint32_t rank, const wire::ManifestPart& part) {
  if (owned_total_[rank] != 0 && owned_total_[rank] != part.owned_total) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest says ", part.owned_total, " chunks, an earlier part said ", owned_total_[rank]));
  }
  // Check the whole part before applying any of it.
  uint32_t fresh = 0;
  for (size_t i = 0; i < part.classes.size(); ++i) {
    const uint8_t now = cell(rank, part.first + i) & kClassMask;
    const uint8_t want = part.classes[i] == wire::kNotHere ? kNotHereCell : part.classes[i];
    if (now != kUnknown && now != want) {
      return absl::InvalidArgumentError(absl::StrCat("manifest changes the class of chunk ", part.first + i));
    }
    fresh += now == kUnknown && want != kNotHereCell;
  }
  if (owned_known_[rank] + fresh > part.owned_total) {
    return absl::InvalidArgumentError(absl::StrCat("manifest declares more than its ", part.owned_total, " chunks"));
  }
  const bool was_complete = has_manifest(rank);
  owned_total_[rank] = part.owned_total;
  for (size_t i = 0; i < part.classes.size(); ++i) {
    const uint32_t c = part.first + static_cast<uint32_t>(i);
    uint8_t& x = cell(rank, c);
    if ((x & kClassMask) != kUnknown) continue;
    const uint8_t cls = part.classes[i] == wire::kNotHere ? kNotHereCell : part.classes[i];
    x = static_cast<uint8_t>((x & kGot) | cls);
    if (cls == kNotHereCell) continue;
    if (x & kGot) Advance(rank, c, cls);
    ++owned_known_[rank];
    owned_[c] = true;
    const bool missing = !(x & kGot);
    if (cls == 0) {
      class0_missing_ += missing;
    } else {
      ++droppable_total_;
      droppable_missing_ += missing;
    }
  }
  ppm_ = std::min(ppm_, part.loss_bound_ppm);
  if (!was_complete && has_manifest(rank)) --manifests_missing_;
  return absl::OkStatus();
}

void LossTracker::MarkSentThrough(uint32_t rank, uint32_t chunk) {
  sent_through_[rank] = std::max(sent_through_[rank], std::min(chunk + 1, chunks_));
}

void LossTracker::Advance(uint32_t rank, uint32_t chunk, uint8_t cls) {
  if (cls < wire::kNumClasses) class_frontier_[rank][cls] = std::max(class_frontier_[rank][cls], chunk + 1);
}

void LossTracker::OnContribution(uint32_t rank, uint32_t chunk) {
  uint8_t& x = cell(rank, chunk);
  Advance(rank, chunk, x & kClassMask);
  if (x & kGot) return;
  x |= kGot;
  const uint8_t cls = x & kClassMask;
  if (cls == 0) {
    --class0_missing_;
  } else if (cls < wire::kNumClasses) {
    --droppable_missing_;
  }
}

uint8_t LossTracker::class_of(uint32_t rank, uint32_t chunk) const {
  const uint8_t cls = cell(rank, chunk) & kClassMask;
  return cls < wire::kNumClasses ? cls : wire::kNotHere;
}

std::vector<std::vector<uint32_t>> LossTracker::RepairPlan(uint32_t rotate, bool fresh_only) {
  std::vector<std::vector<uint32_t>> plan(world_);
  // (class, turn, worker offset, chunk): sorting gives class order, then round-robin over workers.
  std::vector<std::tuple<uint8_t, uint32_t, uint32_t, uint32_t>> droppable;
  size_t known_lost = 0, already_asked = 0;
  for (uint32_t w = 0; w < world_; ++w) {
    uint32_t turn[wire::kNumClasses] = {};
    for (uint32_t c = 0; c < chunks_; ++c) {
      uint8_t& x = cell(w, c);
      const uint8_t cls = x & kClassMask;
      if ((x & kGot) || cls >= wire::kNumClasses) continue;
      if (c >= class_frontier_[w][cls] && c >= sent_through_[w]) continue;  // may still be on its way
      const bool asked = x & kAsked;
      if (cls == 0) {
        if (!(fresh_only && asked)) {
          plan[w].push_back(c);
          x |= kAsked;
        }
        continue;
      }
      ++known_lost;
      if (fresh_only && asked) {
        ++already_asked;
        continue;
      }
      droppable.emplace_back(cls, turn[cls]++, (w + world_ - rotate % world_) % world_, c);
    }
  }
  const uint32_t allowed = allowed_missing();
  const size_t need = known_lost > allowed + already_asked ? known_lost - allowed - already_asked : 0;
  std::partial_sort(droppable.begin(), droppable.begin() + std::min(need, droppable.size()), droppable.end());
  for (size_t i = 0; i < need && i < droppable.size(); ++i) {
    const auto& [cls, turn, offset, c] = droppable[i];
    const uint32_t w = (offset + rotate) % world_;
    plan[w].push_back(c);
    cell(w, c) |= kAsked;
  }
  for (auto& p : plan) std::sort(p.begin(), p.end());
  return plan;
}

}  // namespace dlcp::server
