#include "common/wire/header.h"

#include "common/wire/endian.h"

namespace dlcp::wire {
namespace {
static_assert(kHeaderSize == 48, "wire header v1 is 48 bytes");

// Field offsets; docs/wire-format.md has the same table.
enum Offset : size_t {
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
  kOffReserved = 44,
};
static_assert(kOffReserved + 4 == kHeaderSize);

bool CarriesFloats(MsgType t) { return t == MsgType::kPush || t == MsgType::kResult; }
}  // namespace

const char* RejectName(Reject r) {
  switch (r) {
    case Reject::kNone: return "none";
    case Reject::kTruncated: return "truncated";
    case Reject::kBadMagic: return "bad_magic";
    case Reject::kBadVersion: return "bad_version";
    case Reject::kBadType: return "bad_type";
    case Reject::kBadClass: return "bad_class";
    case Reject::kBadFlags: return "bad_flags";
    case Reject::kLengthMismatch: return "length_mismatch";
    case Reject::kBadChunk: return "bad_chunk";
    case Reject::kReservedSet: return "reserved_set";
    case Reject::kBadPayload: return "bad_payload";
    case Reject::kUnknownJob: return "unknown_job";
    case Reject::kNotMember: return "not_member";
    case Reject::kStaleEpoch: return "stale_epoch";
    case Reject::kShapeMismatch: return "shape_mismatch";
    case Reject::kUnknownRound: return "unknown_round";
    case Reject::kOverCapacity: return "over_capacity";
    case Reject::kJobFailed: return "job_failed";
    case Reject::kMissingMac: return "missing_mac";
    case Reject::kBadMac: return "bad_mac";
    case Reject::kCount: break;
  }
  return "unknown";
}

void EncodeHeader(const Header& h, uint8_t* out) {
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
  PutLE32(out + kOffReserved, 0);
}

Reject ParseHeader(absl::Span<const uint8_t> d, Header* out) {
  if (d.size() < kHeaderSize) return Reject::kTruncated;
  const uint8_t* p = d.data();
  if (GetLE32(p + kOffMagic) != kMagic) return Reject::kBadMagic;
  if (p[kOffVersion] != kVersion) return Reject::kBadVersion;
  uint8_t type = p[kOffType];
  if (type == 0 || type > kMaxMsgType) return Reject::kBadType;
  if (p[kOffClass] >= kNumClasses) return Reject::kBadClass;
  if ((p[kOffFlags] & ~kKnownFlags) != 0) return Reject::kBadFlags;
  if (GetLE32(p + kOffReserved) != 0) return Reject::kReservedSet;
  Header h;
  h.type = static_cast<MsgType>(type);
  h.priority = p[kOffClass];
  h.flags = p[kOffFlags];
  h.job = GetLE32(p + kOffJob);
  h.key = GetLE32(p + kOffKey);
  h.round = GetLE32(p + kOffRound);
  h.chunk = GetLE32(p + kOffChunk);
  h.chunk_count = GetLE32(p + kOffChunkCount);
  h.tensor_elems = GetLE32(p + kOffTensorElems);
  h.rank = GetLE16(p + kOffRank);
  h.contributors = GetLE16(p + kOffContributors);
  h.epoch = GetLE32(p + kOffEpoch);
  h.payload_len = GetLE32(p + kOffPayloadLen);
  const size_t trailer = (h.flags & kFlagMac) ? kMacSize : 0;
  if (d.size() < kHeaderSize + trailer || h.payload_len != d.size() - kHeaderSize - trailer ||
      h.payload_len > kMaxPayload - trailer) {
    return Reject::kLengthMismatch;
  }
  if (CarriesFloats(h.type)) {
    if (h.chunk_count == 0 || h.chunk >= h.chunk_count || h.tensor_elems == 0) return Reject::kBadChunk;
    if (h.payload_len == 0 || h.payload_len % sizeof(float) != 0) return Reject::kBadPayload;
  }
  *out = h;
  return Reject::kNone;
}

}  // namespace dlcp::wire
