// Payload of kPushNack and kResultReq: a list of chunk ranges.
//   u32 count, then count x (u32 first, u32 length), little-endian.
// Ranges are compact for the common case (a contiguous tail lost) and bounded for the worst case.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/wire/header.h"

namespace dlcp::wire {

struct ChunkRange {
  uint32_t first = 0;
  uint32_t length = 0;
  bool operator==(const ChunkRange&) const = default;
};

// Range lists are split into payloads of at most this many bytes, so one repair message stays
// small even over loopback's 64 KiB datagrams.
inline constexpr size_t kMaxRangesPayload = 8192;

// The payload limit of control messages (ranges, manifests, STOP): no larger than a data chunk,
// so they fit wherever the job's pushes fit (a 1500-byte MTU with no fragmentation, too).
inline size_t ControlPayloadLimit(size_t max_datagram, uint32_t chunk_bytes) {
  return std::min({max_datagram - kHeaderSize - kMacSize, kMaxRangesPayload, static_cast<size_t>(chunk_bytes)});
}

// Collapses sorted, distinct chunk indices into ranges.
std::vector<ChunkRange> ToRanges(absl::Span<const uint32_t> sorted_chunks);

// Splits ranges into payloads of at most max_payload bytes each. Empty input gives one empty
// list (count 0), which is how kResultReq says "nothing missing".
std::vector<std::vector<uint8_t>> EncodeRanges(absl::Span<const ChunkRange> ranges, size_t max_payload);

// Checks the count against the length, and every range against chunk_count.
absl::StatusOr<std::vector<ChunkRange>> DecodeRanges(absl::Span<const uint8_t> payload, uint32_t chunk_count);

}  // namespace dlcp::wire
