// Reading what a test's processes wrote, and counting what it holds.
#pragma once

#include <cstddef>
#include <fstream>
#include <sstream>
#include <string>

namespace dlcp::testing {

// The whole file; empty if it cannot be read.
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// How often `what` occurs in `text`, without overlaps.
inline size_t CountOccurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

}  // namespace dlcp::testing
