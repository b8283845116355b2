#include "common/wire/bounded.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/wire/endian.h"
#include "common/wire/header.h"

namespace dlcp::wire {

std::vector<std::vector<uint8_t>> EncodeManifest(uint32_t loss_bound_ppm, absl::Span<const uint8_t> classes,
                                                 size_t max_payload) {
  size_t lo = 0, hi = classes.size();
  while (lo < hi && classes[lo] == kNotHere) ++lo;
  while (hi > lo && classes[hi - 1] == kNotHere) --hi;
  const uint32_t owned = static_cast<uint32_t>(
      std::count_if(classes.begin() + lo, classes.begin() + hi, [](uint8_t c) { return c != kNotHere; }));
  const size_t per_part = max_payload > kManifestPrefix ? max_payload - kManifestPrefix : 1;
  std::vector<std::vector<uint8_t>> out;
  size_t first = lo;
  do {
    const size_t n = std::min(per_part, hi - first);
    std::vector<uint8_t> p(kManifestPrefix + n);
    PutLE32(p.data(), loss_bound_ppm);
    PutLE32(p.data() + 4, owned);
    PutLE32(p.data() + 8, static_cast<uint32_t>(first));
    PutLE32(p.data() + 12, static_cast<uint32_t>(n));
    std::copy(classes.begin() + first, classes.begin() + first + n, p.begin() + kManifestPrefix);
    out.push_back(std::move(p));
    first += n;
  } while (first < hi);
  return out;
}

absl::StatusOr<ManifestPart> DecodeManifest(absl::Span<const uint8_t> payload, uint32_t chunk_count) {
  if (payload.size() < kManifestPrefix) return absl::InvalidArgumentError("manifest shorter than its prefix");
  ManifestPart m;
  m.loss_bound_ppm = GetLE32(payload.data());
  m.owned_total = GetLE32(payload.data() + 4);
  m.first = GetLE32(payload.data() + 8);
  const uint32_t count = GetLE32(payload.data() + 12);
  if (m.loss_bound_ppm > kPpm) return absl::InvalidArgumentError(absl::StrCat("loss bound ", m.loss_bound_ppm, " ppm"));
  if (m.owned_total == 0 || m.owned_total > chunk_count) {
    return absl::InvalidArgumentError(absl::StrCat("manifest owns ", m.owned_total, " of ", chunk_count, " chunks"));
  }
  if (payload.size() != kManifestPrefix + static_cast<uint64_t>(count) ||
      static_cast<uint64_t>(m.first) + count > chunk_count) {
    return absl::InvalidArgumentError(absl::StrCat("manifest part [", m.first, ", +", count, ") in ", payload.size(),
                                                   " bytes for ", chunk_count, " chunks"));
  }
  m.classes.assign(payload.begin() + kManifestPrefix, payload.end());
  for (uint8_t c : m.classes) {
    if (c >= kNumClasses && c != kNotHere) return absl::InvalidArgumentError(absl::StrCat("manifest class ", c));
  }
  return m;
}

std::vector<std::vector<uint8_t>> EncodeStop(uint32_t droppable_total, uint32_t droppable_missing,
                                             absl::Span<const ChunkRange> left_out, size_t max_payload) {
  std::vector<std::vector<uint8_t>> out = EncodeRanges(left_out, max_payload - kStopPrefix);
  for (std::vector<uint8_t>& p : out) {
    p.insert(p.begin(), kStopPrefix, 0);
    PutLE32(p.data(), droppable_total);
    PutLE32(p.data() + 4, droppable_missing);
  }
  return out;
}

absl::StatusOr<StopInfo> DecodeStop(absl::Span<const uint8_t> payload, uint32_t chunk_count) {
  if (payload.size() < kStopPrefix) return absl::InvalidArgumentError("stop shorter than its prefix");
  StopInfo s;
  s.droppable_total = GetLE32(payload.data());
  s.droppable_missing = GetLE32(payload.data() + 4);
  if (s.droppable_missing > s.droppable_total) {
    return absl::InvalidArgumentError(absl::StrCat("stop: ", s.droppable_missing, " of ", s.droppable_total, " missing"));
  }
  absl::StatusOr<std::vector<ChunkRange>> r = DecodeRanges(payload.subspan(kStopPrefix), chunk_count);
  if (!r.ok()) return r.status();
  s.left_out = std::move(*r);
  return s;
}

}  // namespace dlcp::wire
