// AVX2 clones of hot loops, picked at load time where the CPU has AVX2 (GNU ifunc). The result
// never depends on the clone: callers fix the order of every floating-point operation.
// ThreadSanitizer's runtime is not up yet when ifunc resolvers run at load time (the program
// crashes before main), so TSan builds go without.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define DLCP_AVX2_CLONES
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DLCP_AVX2_CLONES
#endif
#endif
#ifndef DLCP_AVX2_CLONES
#define DLCP_AVX2_CLONES __attribute__((target_clones("avx2", "default")))
#endif
