#include "common/wire/ranges.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/wire/endian.h"

namespace dlcp::wire {
namespace {
void Append32(std::vector<uint8_t>& out, uint32_t v) {
  out.resize(out.size() + 4);
  PutLE32(out.data() + out.size() - 4, v);
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
    Append32(p, 0);
    for (size_t k = 0; k < n; ++k, ++i) {
      Append32(p, ranges[i].first);
      Append32(p, ranges[i].length);
    }
    PutLE32(p.data(), static_cast<uint32_t>(n));  // the count, now known
    out.push_back(std::move(p));
  } while (i < ranges.size());
  return out;
}

absl::StatusOr<std::vector<ChunkRange>> DecodeRanges(absl::Span<const uint8_t> payload, uint32_t chunk_count) {
  if (payload.size() < 4) return absl::InvalidArgumentError("range list shorter than its count");
  uint32_t count = GetLE32(payload.data());
  if (payload.size() != 4 + static_cast<uint64_t>(count) * 8) {
    return absl::InvalidArgumentError(absl::StrCat("range list of ", count, " entries but ", payload.size(), " bytes"));
  }
  std::vector<ChunkRange> out;
  out.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    ChunkRange r{GetLE32(payload.data() + 4 + 8 * i), GetLE32(payload.data() + 8 + 8 * i)};
    if (r.length == 0 || static_cast<uint64_t>(r.first) + r.length > chunk_count) {
      return absl::InvalidArgumentError(
          absl::StrCat("range [", r.first, ", +", r.length, ") outside ", chunk_count, " chunks"));
    }
    out.push_back(r);
  }
  return out;
}

}  // namespace dlcp::wire
