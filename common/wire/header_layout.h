// The header's byte layout, and its encoder in a form that compiles for a CUDA device too, so the
// GPU packer writes headers with the same code as the host (docs/wire-format.md has the table).
#pragma once

#include <cstddef>

#include "common/base/hd.h"
#include "common/wire/endian.h"
#include "common/wire/header.h"

namespace dlcp::wire {

enum HeaderOffset : size_t {
  kOffMagic = 0,
  kOffVersion = 4,
  kOffType = 5,
  kOffClass = 6,
  kOffFlags = 7,
  kOffJob = 8,
  kOffKey = 12,
  kOffRound = 16,
  kOffChunk = 20,
  kOffChunkCount = 24,
  kOffTensorElems = 28,
  kOffRank = 32,
  kOffContributors = 34,
  kOffEpoch = 36,
  kOffPayloadLen = 40,
  kOffEncoding = 44,
  kOffLostClass = 45,
  kOffReserved = 46,  // 2 bytes, zero
};
static_assert(kOffReserved + 2 == kHeaderSize);

DLCP_HD inline void EncodeHeaderBytes(const Header& h, uint8_t* out) {
  PutLE32(out + kOffMagic, kMagic);
  out[kOffVersion] = kVersion;
  out[kOffType] = static_cast<uint8_t>(h.type);
  out[kOffClass] = h.priority;
  out[kOffFlags] = h.flags;
  PutLE32(out + kOffJob, h.job);
  PutLE32(out + kOffKey, h.key);
  PutLE32(out + kOffRound, h.round);
  PutLE32(out + kOffChunk, h.chunk);
  PutLE32(out + kOffChunkCount, h.chunk_count);
  PutLE32(out + kOffTensorElems, h.tensor_elems);
  PutLE16(out + kOffRank, h.rank);
  PutLE16(out + kOffContributors, h.contributors);
  PutLE32(out + kOffEpoch, h.epoch);
  PutLE32(out + kOffPayloadLen, h.payload_len);
  out[kOffEncoding] = h.encoding;
  out[kOffLostClass] = h.lost_class;
  out[kOffReserved] = out[kOffReserved + 1] = 0;
}

}  // namespace dlcp::wire
