// Payloads of the bounded-loss messages (see docs/wire-format.md).
//
// kManifest, worker -> aggregator endpoint, class 0, one or more per round:
//   u32 loss_bound_ppm   ε in parts per million (0 .. 1,000,000)
//   u32 owned_total      how many chunks this worker pushes to this endpoint in the round
//   u32 first, u32 count then `count` bytes: the class (0..3) of chunks first .. first+count-1,
//                        or kNotHere for a chunk pushed elsewhere
// The aggregator needs it to tell a lost class-0 contribution from a lost droppable one, and to
// know the denominator of the loss fraction before anything is lost.
//
// kStop, aggregator -> worker, class 0, one or more per round:
//   u32 droppable_total, u32 droppable_missing   the endpoint's whole shard, all workers
//   then a range list (ranges.h) of this worker's chunks left out of the sum
//   Its header's `chunk` (which a STOP has no other use for) is the tail wait: microseconds from
//   the bound being met to the seal, saturated (EncodeTailWait). Receivers that predate it
//   ignore it, and those that read it get 0 from aggregators that predate it.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/wire/ranges.h"

namespace dlcp::wire {

inline constexpr uint8_t kNotHere = 0xFF;
inline constexpr uint32_t kPpm = 1000000;
inline constexpr size_t kManifestPrefix = 16;
inline constexpr size_t kStopPrefix = 8;

struct ManifestPart {
  uint32_t loss_bound_ppm = 0;
  uint32_t owned_total = 0;
  uint32_t first = 0;
  std::vector<uint8_t> classes;  // of chunks first .. first + classes.size() - 1
};

// Splits `classes` (one entry per chunk of the tensor) into parts of at most max_payload bytes,
// covering only the span between the first and last chunk that is not kNotHere.
std::vector<std::vector<uint8_t>> EncodeManifest(uint32_t loss_bound_ppm, absl::Span<const uint8_t> classes,
                                                 size_t max_payload);
absl::StatusOr<ManifestPart> DecodeManifest(absl::Span<const uint8_t> payload, uint32_t chunk_count);

inline uint32_t EncodeTailWait(absl::Duration wait) {
  const int64_t us = absl::ToInt64Microseconds(wait);
  return us <= 0 ? 0 : us >= int64_t{UINT32_MAX} ? UINT32_MAX : static_cast<uint32_t>(us);
}
inline absl::Duration DecodeTailWait(uint32_t chunk_field) { return absl::Microseconds(chunk_field); }

struct StopInfo {
  uint32_t droppable_total = 0;
  uint32_t droppable_missing = 0;
  std::vector<ChunkRange> left_out;
};

std::vector<std::vector<uint8_t>> EncodeStop(uint32_t droppable_total, uint32_t droppable_missing,
                                             absl::Span<const ChunkRange> left_out, size_t max_payload);
absl::StatusOr<StopInfo> DecodeStop(absl::Span<const uint8_t> payload, uint32_t chunk_count);

}  // namespace dlcp::wire
