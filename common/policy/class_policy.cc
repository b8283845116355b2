#include "common/policy/class_policy.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"

namespace dlcp {
namespace {

class MagnitudeLayerPolicy : public ClassPolicy {
 public:
  explicit MagnitudeLayerPolicy(double reliable_fraction) : reliable_fraction_(reliable_fraction) {}

  void Classify(absl::Span<const float> data, const wire::ChunkGeometry& g, const TensorInfo& tensor,
                absl::Span<uint8_t> classes) override {
    const uint32_t n = g.chunk_count();
    norms_.resize(n);
    order_.resize(n);
    for (uint32_t c = 0; c < n; ++c) {
      const float* p = data.data() + g.offset(c);
      double sum = 0;
      for (uint32_t i = 0; i < g.elems(c); ++i) sum += static_cast<double>(p[i]) * p[i];
      // A NaN or infinite gradient is the loudest signal there is: never drop it.
      norms_[c] = std::isfinite(sum) ? sum : INFINITY;
    }
    std::iota(order_.begin(), order_.end(), 0u);
    // Largest first; ties by index so every run classifies the same bytes the same way.
    std::sort(order_.begin(), order_.end(), [&](uint32_t a, uint32_t b) {
      return norms_[a] != norms_[b] ? norms_[a] > norms_[b] : a < b;
    });
    const uint32_t reliable = std::min<uint32_t>(n, static_cast<uint32_t>(std::ceil(reliable_fraction_ * n - 1e-9)));
    const bool layered = tensor.num_layers > 1;
    const double layer = layered ? std::min(1.0, static_cast<double>(tensor.layer) / tensor.num_layers) : 0;
    const uint32_t rest = n - reliable;
    for (uint32_t i = 0; i < n; ++i) {
      if (i < reliable) {
        classes[order_[i]] = 0;
        continue;
      }
      const double magnitude = static_cast<double>(i - reliable) / rest;
      const double score = layered ? (magnitude + layer) / 2 : magnitude;
      const int tier = static_cast<int>(3 * score);
      classes[order_[i]] = static_cast<uint8_t>(1 + std::clamp(tier, 0, 2));
    }
  }

 private:
  double reliable_fraction_;
  std::vector<double> norms_;
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

absl::StatusOr<ClassPolicyOptions::Kind> ParseClassPolicyKind(const std::string& name) {
  if (name == "magnitude-layer") return ClassPolicyOptions::Kind::kMagnitudeLayer;
  if (name == "uniform") return ClassPolicyOptions::Kind::kUniform;
  return absl::InvalidArgumentError(absl::StrCat("class policy '", name, "': expected magnitude-layer or uniform"));
}

absl::StatusOr<std::unique_ptr<ClassPolicy>> CreateClassPolicy(const ClassPolicyOptions& o) {
  switch (o.kind) {
    case ClassPolicyOptions::Kind::kMagnitudeLayer:
      if (!(o.reliable_fraction >= 0 && o.reliable_fraction <= 1)) {
        return absl::InvalidArgumentError(absl::StrCat("reliable fraction ", o.reliable_fraction, " is not in [0, 1]"));
      }
      return std::make_unique<MagnitudeLayerPolicy>(o.reliable_fraction);
    case ClassPolicyOptions::Kind::kUniform:
      if (o.uniform_class > 3) return absl::InvalidArgumentError(absl::StrCat("class ", o.uniform_class, " is not in [0, 3]"));
      return std::make_unique<UniformPolicy>(o.uniform_class);
  }
  return absl::InvalidArgumentError("unknown class policy");
}

}  // namespace dlcp
