// Which priority class each chunk of a tensor rides in. Class 0 is must-deliver; classes 1..3
// may be dropped, 1 last. The class picks the DSCP code point (so a strict-priority switch
// serves class 0 first) and tells the aggregator which losses the bound ε may absorb.
//
// Threading: a policy is owned by one client I/O thread; Classify must be fast (one pass over
// the tensor) and never block.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/classes/chunk_magnitude.h"
#include "common/wire/geometry.h"

namespace dlcp {

struct TensorInfo {
  uint32_t layer = 0;       // position from the input (0) towards the output
  uint32_t num_layers = 0;  // 0: unknown, every tensor counts as layer 0
  // Its round's ε: 0 is reliable (every chunk must arrive); < 0 unknown.
  double loss_bound = -1;
};

class ClassPolicy {
 public:
  virtual ~ClassPolicy() = default;
  // Writes the class of every chunk of `data`, as cut by `geometry`, into classes[chunk].
  virtual void Classify(absl::Span<const float> data, const wire::ChunkGeometry& geometry, const TensorInfo& tensor,
                        absl::Span<uint8_t> classes) = 0;
};

struct ClassPolicyOptions {
  enum class Kind { kMagnitudeLayer, kUniform };
  Kind kind = Kind::kMagnitudeLayer;
  // kMagnitudeLayer: this fraction of chunks, largest L2 norm first, goes to class 0.
  double reliable_fraction = 0.1;
  // kUniform: every chunk gets this class (class 0 everywhere is fully reliable).
  uint8_t uniform_class = 1;
  // kMagnitudeLayer, in a reliable round (TensorInfo::loss_bound 0): rank its chunks by magnitude as
  // well. Off by default: where every chunk must arrive, magnitude says nothing about which may
  // wait, and strict priority between a tensor's own chunks only reorders them. The least
  // important class then sits starved in its switch queue until it overflows, and its late
  // results read as losses (docs/congestion.md, "One class per reliable tensor").
  bool rank_reliable = false;
};

absl::StatusOr<ClassPolicyOptions::Kind> ParseClassPolicyKind(const std::string& name);

// kMagnitudeLayer: the top reliable_fraction of chunks by L2 norm go to class 0. The rest get a
// score in [0, 1): their magnitude rank among themselves as a fraction (0: largest norm), averaged
// with the layer position (layer / num_layers) when the depth is known. Thirds of the score range
// are classes 1, 2 and 3. Layers near the input come first because the next forward pass needs
// them first; a tensor of unknown depth spreads over all three classes by magnitude alone.
// A reliable tensor (unless rank_reliable) rides one class: the third its layer position falls
// in, class 1 when the depth is unknown. Class 0 stays for control messages and repairs.
// Under a bound ε below 1/3, the lowest class takes only the bottom ε of the score range and the
// middle one the next 2ε, rather than thirds: a round must still receive all but ε of the
// droppable chunks, and a class that strict priority starves (and that shares DSCP 0 with
// best-effort traffic) should hold no more than the bound lets it lose.
absl::StatusOr<std::unique_ptr<ClassPolicy>> CreateClassPolicy(const ClassPolicyOptions& options);
// What CreateClassPolicy checks, without making a policy.
absl::Status ValidateClassPolicy(const ClassPolicyOptions& options);

// The classes that chunks with these magnitudes (chunk_magnitude.h) earn under `tiers`; `order`
// is scratch. Shared by the magnitude-layer policy and the packers.
void ClassesByMagnitude(absl::Span<const double> magnitudes, const ClassTiers& tiers, absl::Span<uint8_t> classes,
                        std::vector<uint64_t>* keys, std::vector<uint32_t>* order);
// The tiers of one tensor of `chunks` chunks under `options`, which CreateClassPolicy accepted.
ClassTiers TiersFor(const ClassPolicyOptions& options, uint32_t chunks, const TensorInfo& tensor);

}  // namespace dlcp
