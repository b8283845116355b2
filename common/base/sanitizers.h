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
