#include "common/wire/header.h"

namespace dlcp::wire {
namespace {
static_assert(kHeaderSize == 48, "wire header v1 is 48 bytes");

inline void Put16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
inline void Put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint16_t Get16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
inline uint32_t Get32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

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
  Put32(out + kOffMagic, kMagic);
  out[kOffVersion] = kVersion;
  out[kOffType] = static_cast<uint8_t>(h.type);
  out[kOffClass] = h.priority;
  out[kOffFlags] = h.flags;
  Put32(out + kOffJob, h.job);
  Put32(out + kOffKey, h.key);
  Put32(out + kOffRound, h.round);
  Put32(out + kOffChunk, h.chunk);
  Put32(out + kOffChunkCount, h.chunk_count);
  Put32(out + kOffTensorElems, h.tensor_elems);
  Put16(out + kOffRank, h.rank);
  Put16(out + kOffContributors, h.contributors);
  Put32(out + kOffEpoch, h.epoch);
  Put32(out + kOffPayloadLen, h.payload_len);
  Put32(out + kOffReserved, 0);
}

Reject ParseHeader(absl::Span<const uint8_t> d, Header* out) {
  if (d.size() < kHeaderSize) return Reject::kTruncated;
  const uint8_t* p = d.data();
  if (Get32(p + kOffMagic) != kMagic) return Reject::kBadMagic;
  if (p[kOffVersion] != kVersion) return Reject::kBadVersion;
  uint8_t type = p[kOffType];
  if (type == 0 || type > kMaxMsgType) return Reject::kBadType;
  if (p[kOffClass] >= kNumClasses) return Reject::kBadClass;
  if ((p[kOffFlags] & ~kKnownFlags) != 0) return Reject::kBadFlags;
  if (Get32(p + kOffReserved) != 0) return Reject::kReservedSet;
  Header h;
  h.type = static_cast<MsgType>(type);
  h.priority = p[kOffClass];
  h.flags = p[kOffFlags];
  h.job = Get32(p + kOffJob);
  h.key = Get32(p + kOffKey);
  h.round = Get32(p + kOffRound);
  h.chunk = Get32(p + kOffChunk);
  h.chunk_count = Get32(p + kOffChunkCount);
  h.tensor_elems = Get32(p + kOffTensorElems);
  h.rank = Get16(p + kOffRank);
  h.contributors = Get16(p + kOffContributors);
  h.epoch = Get32(p + kOffEpoch);
  h.payload_len = Get32(p + kOffPayloadLen);
  const size_t trailer = (h.flags & kFlagMac) ? kMacTrailer : 0;
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
