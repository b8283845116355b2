// Broken-invariant checks for the daemon. Library code linked into a trainer returns absl::Status
// instead: nothing under client/ may use these.
#pragma once

#include <cstdlib>
#include <iostream>
#include <sstream>

namespace dlcp::internal {
[[noreturn]] void CheckFailed(const char* file, int line, const std::string& message);

template <typename A, typename B>
std::string CheckOpMessage(const char* expr, const A& a, const B& b) {
  std::ostringstream os;
  os << "Check failed: " << expr << " (" << a << " vs. " << b << ")";
  return os.str();
}
}  // namespace dlcp::internal

#define DLCP_CHECK(cond)                                                            \
  do {                                                                              \
    if (!(cond)) ::dlcp::internal::CheckFailed(__FILE__, __LINE__, "Check failed: " #cond); \
  } while (0)

#define DLCP_CHECK_OP_(op, a, b)                                                     \
  do {                                                                               \
    const auto& dlcp_a_ = (a);                                                       \
    const auto& dlcp_b_ = (b);                                                       \
    if (!(dlcp_a_ op dlcp_b_))                                                       \
      ::dlcp::internal::CheckFailed(                                                 \
          __FILE__, __LINE__,                                                        \
          ::dlcp::internal::CheckOpMessage(#a " " #op " " #b, dlcp_a_, dlcp_b_));    \
  } while (0)

#define DLCP_CHECK_EQ(a, b) DLCP_CHECK_OP_(==, a, b)
#define DLCP_CHECK_NE(a, b) DLCP_CHECK_OP_(!=, a, b)
#define DLCP_CHECK_LT(a, b) DLCP_CHECK_OP_(<, a, b)
#define DLCP_CHECK_LE(a, b) DLCP_CHECK_OP_(<=, a, b)
#define DLCP_CHECK_GT(a, b) DLCP_CHECK_OP_(>, a, b)
#define DLCP_CHECK_GE(a, b) DLCP_CHECK_OP_(>=, a, b)
