#include "bench/dlcp_bench/round_values.h"

namespace dlcp::bench {

RoundValues::RoundValues(bool digits, uint32_t world, uint32_t round, uint32_t tensor)
    : world_(world), period_(digits ? 15 : 61), table_(static_cast<size_t>(world) * period_) {
  for (uint32_t r = 0; r < world; ++r) {
    for (uint32_t j = 0; j < period_; ++j) {
      table_[r * period_ + j] = digits ? DigitValue(r, round, tensor, j) : BenchValue(r, round, tensor, j);
    }
  }
}

void RoundValues::Fill(uint32_t rank, uint64_t first, absl::Span<float> out) const {
  const float* row = &table_[rank * period_];
  uint32_t j = static_cast<uint32_t>(first % period_);
  for (float& v : out) {
    v = row[j];
    if (++j == period_) j = 0;
  }
}

std::vector<float> RoundValues::Sum(uint32_t subset) const {
  std::vector<float> sum(period_, 0.0f);
  for (uint32_t r = 0; r < world_ && r < 32; ++r) {
    if (!(subset >> r & 1)) continue;
    for (uint32_t j = 0; j < period_; ++j) sum[j] += table_[r * period_ + j];
  }
  return sum;
}

std::vector<float> RoundValues::SumAll() const {
  std::vector<float> sum(period_, 0.0f);
  for (uint32_t r = 0; r < world_; ++r) {
    for (uint32_t j = 0; j < period_; ++j) sum[j] += table_[r * period_ + j];
  }
  return sum;
}

uint64_t RoundValues::FirstMismatch(const std::vector<float>& sum, uint64_t first, absl::Span<const float> got) const {
  uint32_t j = static_cast<uint32_t>(first % period_);
  for (uint64_t k = 0; k < got.size(); ++k) {
    if (got[k] != sum[j]) return k;
    if (++j == period_) j = 0;
  }
  return got.size();
}

}  // namespace dlcp::bench
