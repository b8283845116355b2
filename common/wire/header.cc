#include "common/wire/header.h"

#include "common/wire/endian.h"
#include "common/wire/header_layout.h"
#include "common/wire/payload_encoding.h"

namespace dlcp::wire {
namespace {
static_assert(kHeaderSize == 48, "wire header v1 is 48 bytes");

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
    case Reject::kBadEncoding: return "bad_encoding";
    case Reject::kUnknownSource: return "unknown_source";
    case Reject::kBadHostGroup: return "bad_host_group";
    case Reject::kCount: break;
  }
  return "unknown";
}

void EncodeHeader(const Header& h, uint8_t* out) { EncodeHeaderBytes(h, out); }

Reject ParseHeader(absl::Span<const uint8_t> d, Header* out) {
  if (d.size() < kHeaderSize) return Reject::kTruncated;
  const uint8_t* p = d.data();
  if (GetLE32(p + kOffMagic) != kMagic) return Reject::kBadMagic;
  if (p[kOffVersion] != kVersion) return Reject::kBadVersion;
  uint8_t type = p[kOffType];
  if (type == 0 || type > kMaxMsgType) return Reject::kBadType;
  if (p[kOffClass] >= kNumClasses) return Reject::kBadClass;
  if ((p[kOffFlags] & ~kKnownFlags) != 0) return Reject::kBadFlags;
  if (p[kOffReserved] != 0 || p[kOffReserved + 1] != 0) return Reject::kReservedSet;
  if (p[kOffLostClass] >= kNumClasses) return Reject::kBadClass;
  if (p[kOffLostClass] != 0 && !(p[kOffFlags] & kFlagRepaired)) return Reject::kReservedSet;
  if (p[kOffEncoding] >= kNumEncodings) return Reject::kBadEncoding;
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
  h.encoding = p[kOffEncoding];
  h.lost_class = p[kOffLostClass];
  const size_t trailer = (h.flags & kFlagMac) ? kMacSize : 0;
  if (d.size() < kHeaderSize + trailer || h.payload_len != d.size() - kHeaderSize - trailer ||
      h.payload_len > kMaxPayload - trailer) {
    return Reject::kLengthMismatch;
  }
  if (CarriesFloats(h.type)) {
    if (h.chunk_count == 0 || h.chunk >= h.chunk_count || h.tensor_elems == 0) return Reject::kBadChunk;
    const uint32_t width = EncodingWidth(static_cast<Encoding>(h.encoding));
    if (h.payload_len == 0 || h.payload_len % width != 0) return Reject::kBadPayload;
  } else if (h.encoding != 0) {
    return Reject::kBadEncoding;  // only values are encoded
  }
  *out = h;
  return Reject::kNone;
}

}  // namespace dlcp::wire
