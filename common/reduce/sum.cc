#include "common/reduce/sum.h"

// target_clones makes GCC emit an AVX-512, an AVX2 and a baseline SSE2 body and pick one through
// an ifunc when the library loads, so one binary runs everywhere at the best width. Sanitizer
// runtimes are not up yet when ifunc resolvers run, so sanitized builds keep the baseline body.
#include "common/base/sanitizers.h"

#if defined(DLCP_UNDER_SANITIZER)
#define DLCP_ISA_CLONES
#else
#define DLCP_ISA_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif

namespace dlcp::reduce {

DLCP_ISA_CLONES void SumInto(float* __restrict dst,
                                                                          const float* __restrict src, size_t n) {
#pragma GCC ivdep
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

DLCP_ISA_CLONES void SumOf(float* __restrict dst, const float* __restrict a, const float* __restrict b, size_t n) {
#pragma GCC ivdep
  for (size_t i = 0; i < n; ++i) dst[i] = a[i] + b[i];
}

__attribute__((optimize("no-tree-vectorize"))) void SumIntoScalar(float* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    volatile float a = dst[i];
    dst[i] = a + src[i];
  }
}

}  // namespace dlcp::reduce
