// The bench's values and its exactness check: the check is what every end-to-end test relies on
// to catch a wrong sum, so it must flag one.
#include "bench/dlcp_bench/round_values.h"

#include <gtest/gtest.h>

#include <vector>

namespace dlcp::bench {
namespace {

class RoundValuesTest : public ::testing::TestWithParam<bool> {};

TEST_P(RoundValuesTest, FillGivesEachWorkersValuesFromAnyOffset) {
  const bool digits = GetParam();
  const RoundValues values(digits, 4, 3, 2);
  std::vector<float> out(200);
  for (uint32_t rank = 0; rank < 4; ++rank) {
    values.Fill(rank, 1234567, absl::MakeSpan(out));
    for (uint64_t k = 0; k < out.size(); ++k) {
      const uint64_t i = 1234567 + k;
      ASSERT_EQ(out[k], digits ? DigitValue(rank, 3, 2, i) : BenchValue(rank, 3, 2, i)) << rank << " " << i;
      ASSERT_EQ(values.value(rank, i), out[k]);
    }
  }
}

TEST_P(RoundValuesTest, SumsMatchAndOneWrongElementIsFound) {
  const bool digits = GetParam();
  const RoundValues values(digits, 4, 1, 0);
  const uint64_t first = 999;
  std::vector<float> got(300, 0.0f), part(got.size());
  for (uint32_t rank = 0; rank < 4; ++rank) {
    values.Fill(rank, first, absl::MakeSpan(part));
    for (size_t k = 0; k < got.size(); ++k) got[k] += part[k];
  }
  const std::vector<float> all = values.SumAll();
  EXPECT_EQ(all, values.Sum(0b1111));
  EXPECT_EQ(values.FirstMismatch(all, first, got), got.size());
  got[137] += 1;
  EXPECT_EQ(values.FirstMismatch(all, first, got), 137u);
  EXPECT_EQ(values.FirstMismatch(all, first + 1, got), 0u) << "a shifted period must not match";
}

INSTANTIATE_TEST_SUITE_P(Values, RoundValuesTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Digits" : "Small"; });

TEST(RoundValuesTest, EveryDigitSubsetHasItsOwnSums) {
  // Under bounded loss a result holds some workers' contributions: the check reads which from
  // the digits, so no two subsets may share a sum at any element.
  const RoundValues values(true, kMaxDigitWorkers, 0, 0);
  std::vector<std::vector<float>> sums;
  for (uint32_t subset = 0; subset < (1u << kMaxDigitWorkers); ++subset) sums.push_back(values.Sum(subset));
  for (uint32_t j = 0; j < values.period(); ++j) {
    for (uint32_t a = 0; a < sums.size(); ++a) {
      for (uint32_t b = a + 1; b < sums.size(); ++b) ASSERT_NE(sums[a][j], sums[b][j]) << a << " " << b << " at " << j;
    }
  }
}

}  // namespace
}  // namespace dlcp::bench
