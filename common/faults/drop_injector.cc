#include "common/faults/drop_injector.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace dlcp {

absl::Status ParseClassDrops(const std::string& text, std::array<double, wire::kNumClasses>* out) {
  if (text.empty()) return absl::OkStatus();
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    std::vector<absl::string_view> kv = absl::StrSplit(item, ':');
    uint32_t cls = 0;
    double p = 0;
    if (kv.size() != 2 || !absl::SimpleAtoi(kv[0], &cls) || !absl::SimpleAtod(kv[1], &p)) {
      return absl::InvalidArgumentError(absl::StrCat("'", item, "': expected CLASS:PROBABILITY, e.g. 1:0.05"));
    }
    if (cls >= wire::kNumClasses) return absl::InvalidArgumentError(absl::StrCat("class ", cls, " is not in [0, 3]"));
    if (!(p >= 0 && p <= 1)) return absl::InvalidArgumentError(absl::StrCat("drop probability ", p, " is not in [0, 1]"));
    (*out)[cls] = p;
  }
  return absl::OkStatus();
}

std::string FormatClassDrops(const std::array<double, wire::kNumClasses>& rates) {
  std::string out;
  for (uint32_t c = 0; c < wire::kNumClasses; ++c) {
    if (rates[c] > 0) absl::StrAppend(&out, out.empty() ? "" : ",", c, ":", rates[c]);
  }
  return out;
}

DropInjector::DropInjector(const DropInjectorOptions& options)
    : options_(options), rng_(options.seed) {
  if (options_.burst == 0) options_.burst = 1;
}

bool DropInjector::Drop(uint8_t cls) {
  if (cls >= wire::kNumClasses || options_.rate[cls] <= 0) return false;
  if (burst_left_[cls] > 0) {
    --burst_left_[cls];
    ++dropped_;
    return true;
  }
  // A burst of B drops starts with probability q outside bursts. Per decision, q * B packets are
  // dropped out of 1 + q * (B - 1) seen, so q = r / (B - r * (B - 1)) gives the long-run rate r.
  const double r = options_.rate[cls];
  const double b = options_.burst;
  if (uniform_(rng_) < r / (b - r * (b - 1))) {
    burst_left_[cls] = options_.burst - 1;
    ++dropped_;
    return true;
  }
  return false;
}

}  // namespace dlcp
