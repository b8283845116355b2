// The values dlcp-bench workers contribute, and the exact sums a result must hold.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace dlcp::bench {

// The value worker `rank` contributes at element i of tensor t in round r. Small integers, so
// any sum of up to 2^18 workers is exact in float32.
inline float BenchValue(uint32_t rank, uint32_t round, uint32_t tensor, uint64_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + rank * 13 + round * 5 + tensor * 3) % 61) - 30);
}

// Under bounded loss a result holds only some workers' contributions. Worker r then contributes
// 16^r * d with d in 1..15, so each element spells out which contributions it holds, and the
// check can tell an exact partial sum from a wrong one. Exact in float32 for up to 6 workers.
inline constexpr uint32_t kMaxDigitWorkers = 6;
inline float DigitValue(uint32_t rank, uint32_t round, uint32_t tensor, uint64_t i) {
  return static_cast<float>(1 + (i * 7 + rank * 13 + round * 5 + tensor * 3) % 15) *
         static_cast<float>(uint64_t{1} << (4 * rank));
}

// One round's values of one tensor, for every worker. Both value functions repeat every
// period() elements, so filling and checking a tensor reads a table instead of computing each
// element. That matters on a small test machine, where the workers' own filling and checking
// competes for the CPU with the data plane under measurement.
class RoundValues {
 public:
  RoundValues(bool digits, uint32_t world, uint32_t round, uint32_t tensor);

  uint32_t period() const { return period_; }
  float value(uint32_t rank, uint64_t i) const { return table_[rank * period_ + i % period_]; }
  // Writes worker `rank`'s values of elements [first, first + out.size()) into `out`.
  void Fill(uint32_t rank, uint64_t first, absl::Span<float> out) const;
  // One period of the exact sums of the contributions of the workers in `subset` (bit r: worker
  // r; at most 32 workers), or of every worker.
  std::vector<float> Sum(uint32_t subset) const;
  std::vector<float> SumAll() const;
  // The offset in `got` (elements [first, first + got.size()) of the tensor) of the first element
  // that differs from its element of `sum` (one period, from Sum), or got.size() if none does.
  uint64_t FirstMismatch(const std::vector<float>& sum, uint64_t first, absl::Span<const float> got) const;

 private:
  uint32_t world_;
  uint32_t period_;
  std::vector<float> table_;  // worker r's values, element j of every period: [r * period_ + j]
};

}  // namespace dlcp::bench
