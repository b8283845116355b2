// The bits of JSON written by hand (dlcpctl, the timeline): strings and numbers.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dlcp {

inline std::string Json(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
      continue;
    }
    out += c;
  }
  return out + "\"";
}

// A JSON number that keeps a counter exact: whole values up to 2^53 as integers (60628003, not
// 6.06280e+07), others with every digit a double has.
inline std::string JsonNumber(double v) {
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0) return absl::StrCat(static_cast<int64_t>(v));
  if (!std::isfinite(v)) return "null";
  return absl::StrFormat("%.17g", v);
}

}  // namespace dlcp
