#include "server/engine/reduce.h"

namespace dlcp::engine {

// target_clones makes GCC emit an AVX-512, an AVX2 and a baseline SSE2 body and pick one through
// an ifunc when the library loads, so one binary runs everywhere at the best width.
__attribute__((target_clones("avx512f", "avx2", "default"))) void SumInto(float* __restrict dst,
                                                                          const float* __restrict src, size_t n) {
#pragma GCC ivdep
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

__attribute__((optimize("no-tree-vectorize"))) void SumIntoScalar(float* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    volatile float a = dst[i];
    dst[i] = a + src[i];
  }
}

}  // namespace dlcp::engine
