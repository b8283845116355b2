#include "common/wire/ranges.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace dlcp::wire {
namespace {
void Put32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
uint32_t Get32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}
void SetCount(std::vector<uint8_t>& out, uint32_t count) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(count >> (8 * i));
}
}  // namespace

std::vector<ChunkRange> ToRanges(absl::Span<const uint32_t> sorted) {
  std::vector<ChunkRange> out;
  for (uint32_t c : sorted) {
    if (!out.empty() && out.back().first + out.back().length == c) {
      ++out.back().length;
    } else {
      out.push_back({c, 1});
    }
  }
  return out;
}

std::vector<std::vector<uint8_t>> EncodeRanges(absl::Span<const ChunkRange> ranges, size_t max_payload) {
  const size_t per_packet = max_payload >= 12 ? (max_payload - 4) / 8 : 1;
  std::vector<std::vector<uint8_t>> out;
  size_t i = 0;
  do {
    size_t n = std::min(per_packet, ranges.size() - i);
    std::vector<uint8_t> p;
    p.reserve(4 + 8 * n);
    Put32(p, 0);
    for (size_t k = 0; k < n; ++k, ++i) {
      Put32(p, ranges[i].first);
      Put32(p, ranges[i].length);
    }
    SetCount(p, static_cast<uint32_t>(n));
    out.push_back(std::move(p));
  } while (i < ranges.size());
  return out;
}

absl::StatusOr<std::vector<ChunkRange>> DecodeRanges(absl::Span<const uint8_t> payload, uint32_t chunk_count) {
  if (payload.size() < 4) return absl::InvalidArgumentError("range list shorter than its count");
  uint32_t count = Get32(payload.data());
  if (payload.size() != 4 + static_cast<uint64_t>(count) * 8) {
    return absl::InvalidArgumentError(absl::StrCat("range list of ", count, " entries but ", payload.size(), " bytes"));
  }
  std::vector<ChunkRange> out;
  out.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    ChunkRange r{Get32(payload.data() + 4 + 8 * i), Get32(payload.data() + 8 + 8 * i)};
    if (r.length == 0 || static_cast<uint64_t>(r.first) + r.length > chunk_count) {
      return absl::InvalidArgumentError(
          absl::StrCat("range [", r.first, ", +", r.length, ") outside ", chunk_count, " chunks"));
    }
    out.push_back(r);
  }
  return out;
}

}  // namespace dlcp::wire
