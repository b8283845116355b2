#include "common/classes/class_policy.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/classes/chunk_magnitude.h"
#include "common/base/simd.h"

namespace dlcp {
namespace {

class MagnitudeLayerPolicy : public ClassPolicy {
 public:
  explicit MagnitudeLayerPolicy(const ClassPolicyOptions& options) : options_(options) {}

  void Classify(absl::Span<const float> data, const wire::ChunkGeometry& g, const TensorInfo& tensor,
                absl::Span<uint8_t> classes) override {
    const uint32_t n = g.chunk_count();
    norms_.resize(n);
    for (uint32_t c = 0; c < n; ++c) norms_[c] = ChunkMagnitude(data.data() + g.offset(c), g.elems(c));
    ClassesByMagnitude(norms_, TiersFor(options_, n, tensor), classes, &keys_, &order_);
  }

 private:
  ClassPolicyOptions options_;
  std::vector<double> norms_;
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> order_;
};

class UniformPolicy : public ClassPolicy {
 public:
  explicit UniformPolicy(uint8_t cls) : cls_(cls) {}
  void Classify(absl::Span<const float>, const wire::ChunkGeometry& g, const TensorInfo&,
                absl::Span<uint8_t> classes) override {
    std::fill(classes.begin(), classes.begin() + g.chunk_count(), cls_);
  }

 private:
  uint8_t cls_;
};

}  // namespace

// AVX2 doubles the lanes per instruction where the CPU has it. The result is the same: the
// order of every addition is fixed by the lanes, and a square needs no rounding.
DLCP_AVX2_CLONES double ChunkMagnitude(const float* values, uint32_t n) {
  double lanes[kNormLanes] = {};
  uint32_t base = 0;
  for (; base + kNormLanes <= n; base += kNormLanes) {
    for (uint32_t j = 0; j < kNormLanes; ++j) lanes[j] += static_cast<double>(values[base + j]) * values[base + j];
  }
  for (uint32_t j = 0; base + j < n; ++j) lanes[j] += static_cast<double>(values[base + j]) * values[base + j];
  FoldLanes(lanes);
  return lanes[0];
}

namespace {
// The magnitude-layer tiers before the round's bound has a say (TiersFor).
ClassTiers MagnitudeTiers(double reliable_fraction, uint32_t chunks, uint32_t layer, uint32_t num_layers) {
  ClassTiers t;
  t.chunks = chunks;
  t.reliable = std::min<uint32_t>(chunks, static_cast<uint32_t>(std::ceil(reliable_fraction * chunks - 1e-9)));
  t.layered = num_layers > 1;
  t.layer = t.layered ? std::min(1.0, static_cast<double>(layer) / num_layers) : 0;
  return t;
}
}  // namespace

void ClassesByMagnitude(absl::Span<const double> magnitudes, const ClassTiers& tiers, absl::Span<uint8_t> classes,
                        std::vector<uint64_t>* keys, std::vector<uint32_t>* order) {
  const uint32_t n = static_cast<uint32_t>(magnitudes.size());
  if (tiers.uniform != kNoUniform) {
    std::fill(classes.begin(), classes.begin() + n, tiers.uniform);
    return;
  }
  keys->resize(n);
  order->resize(n);
  for (uint32_t c = 0; c < n; ++c) (*keys)[c] = MagnitudeOrderKey(magnitudes[c]);
  std::iota(order->begin(), order->end(), 0u);
  std::stable_sort(order->begin(), order->end(), [&](uint32_t a, uint32_t b) { return (*keys)[a] < (*keys)[b]; });
  for (uint32_t i = 0; i < n; ++i) classes[(*order)[i]] = ClassAtRank(i, tiers);
}

ClassTiers TiersFor(const ClassPolicyOptions& options, uint32_t chunks, const TensorInfo& tensor) {
  if (options.kind == ClassPolicyOptions::Kind::kUniform) {
    ClassTiers t;
    t.chunks = chunks;
    t.uniform = options.uniform_class;
    return t;
  }
  ClassTiers t = MagnitudeTiers(options.reliable_fraction, chunks, tensor.layer, tensor.num_layers);
  if (tensor.loss_bound == 0 && !options.rank_reliable) {
    // The third its layer position falls in.
    const int tier = static_cast<int>(3 * t.layer);
    t.uniform = static_cast<uint8_t>(1 + std::clamp(tier, 0, 2));
  } else if (tensor.loss_bound > 0 && tensor.loss_bound < 1.0 / 3) {
    // The bottom ε of the score range is class 3, the next 2ε class 2.
    t.by_bound = true;
    t.class3_from = 1 - tensor.loss_bound;
    t.class2_from = 1 - 3 * tensor.loss_bound;
  }
  return t;
}

absl::StatusOr<ClassPolicyOptions::Kind> ParseClassPolicyKind(const std::string& name) {
  if (name == "magnitude-layer") return ClassPolicyOptions::Kind::kMagnitudeLayer;
  if (name == "uniform") return ClassPolicyOptions::Kind::kUniform;
  return absl::InvalidArgumentError(absl::StrCat("class policy '", name, "': expected magnitude-layer or uniform"));
}

absl::Status ValidateClassPolicy(const ClassPolicyOptions& o) {
  switch (o.kind) {
    case ClassPolicyOptions::Kind::kMagnitudeLayer:
      if (!(o.reliable_fraction >= 0 && o.reliable_fraction <= 1)) {
        return absl::InvalidArgumentError(absl::StrCat("reliable fraction ", o.reliable_fraction, " is not in [0, 1]"));
      }
      return absl::OkStatus();
    case ClassPolicyOptions::Kind::kUniform:
      if (o.uniform_class > 3) return absl::InvalidArgumentError(absl::StrCat("class ", o.uniform_class, " is not in [0, 3]"));
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError("unknown class policy");
}

absl::StatusOr<std::unique_ptr<ClassPolicy>> CreateClassPolicy(const ClassPolicyOptions& o) {
  if (absl::Status s = ValidateClassPolicy(o); !s.ok()) return s;
  if (o.kind == ClassPolicyOptions::Kind::kUniform) return std::make_unique<UniformPolicy>(o.uniform_class);
  return std::make_unique<MagnitudeLayerPolicy>(o);
}

}  // namespace dlcp
