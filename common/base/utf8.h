// Cutting text that goes into a proto3 string field, which must stay valid UTF-8.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dlcp {

// Shortens `s` to at most `max` bytes without splitting a multi-byte character.
inline void TruncateUtf8(std::string* s, size_t max) {
  if (s->size() <= max) return;
  size_t cut = max;
  while (cut > 0 && (static_cast<uint8_t>((*s)[cut]) & 0xC0) == 0x80) --cut;
  s->resize(cut);
}

}  // namespace dlcp
