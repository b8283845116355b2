// Which sanitizer this translation unit is built under, in GCC's and clang's spellings, so that
// code which must step aside for a sanitizer runtime asks one place.
#pragma once

#if defined(__SANITIZE_ADDRESS__)
#define DLCP_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DLCP_UNDER_ASAN 1
#endif
#endif

#if defined(__SANITIZE_THREAD__)
#define DLCP_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DLCP_UNDER_TSAN 1
#endif
#endif

#if defined(DLCP_UNDER_ASAN) || defined(DLCP_UNDER_TSAN)
#define DLCP_UNDER_SANITIZER 1
#endif

// Marks memory that must not be touched (a cached buffer) for AddressSanitizer, which then reports
// an access as a use after free; nothing elsewhere.
#if defined(DLCP_UNDER_ASAN)
#include <sanitizer/asan_interface.h>
#define DLCP_POISON_MEMORY(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define DLCP_UNPOISON_MEMORY(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define DLCP_POISON_MEMORY(p, n) ((void)(p), (void)(n))
#define DLCP_UNPOISON_MEMORY(p, n) ((void)(p), (void)(n))
#endif
