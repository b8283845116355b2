#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "common/reduce/sum.h"

namespace dlcp::reduce {
namespace {

// The vectorized sum must equal the scalar reference bit for bit, for every length and alignment:
// a float add is exact-rounded, so lane order cannot matter for an element-wise sum.
TEST(Engine, MatchesScalarReferenceOverOddSizesAndOffsets) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1e3f, 1e3f);
  for (size_t n : {0, 1, 2, 3, 7, 15, 16, 17, 31, 33, 63, 65, 127, 1000, 1023, 4097, 65537}) {
    for (size_t offset : {0, 1, 3}) {
      std::vector<float> src(n + offset), a(n + offset), b;
      for (auto& v : src) v = dist(rng);
      for (auto& v : a) v = dist(rng);
      b = a;
      SumInto(a.data() + offset, src.data() + offset, n);
      SumIntoScalar(b.data() + offset, src.data() + offset, n);
      for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "n=" << n << " offset=" << offset << " i=" << i;
    }
  }
}

TEST(Engine, TouchesNothingPastTheEnd) {
  std::vector<float> dst(40, 1.0f), src(40, 2.0f);
  SumInto(dst.data(), src.data(), 33);
  for (size_t i = 0; i < 33; ++i) EXPECT_EQ(dst[i], 3.0f);
  for (size_t i = 33; i < 40; ++i) EXPECT_EQ(dst[i], 1.0f);
}

}  // namespace
}  // namespace dlcp::reduce
