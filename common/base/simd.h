// AVX2 clones of hot loops, picked at load time where the CPU has AVX2 (GNU ifunc). The result
// never depends on the clone: callers fix the order of every floating-point operation.
// ThreadSanitizer's runtime is not up yet when ifunc resolvers run at load time (the program
// crashes before main), so TSan builds go without.
#pragma once

#include "common/base/sanitizers.h"

#if defined(DLCP_UNDER_TSAN)
#define DLCP_AVX2_CLONES
#else
#define DLCP_AVX2_CLONES __attribute__((target_clones("avx2", "default")))
#endif
