// dlcp data-plane wire format, version 1. Every datagram is one 48-byte header followed by a
// payload. All multi-byte fields are little-endian, written byte by byte, so the format does not
// depend on the host. See docs/wire-format.md.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace dlcp::wire {

inline constexpr uint32_t kMagic = 0x50434C44;  // bytes "DLCP"
inline constexpr uint8_t kVersion = 1;
inline constexpr size_t kHeaderSize = 48;
// The largest UDP payload over IPv4; no dlcp datagram is larger.
inline constexpr size_t kMaxDatagram = 65507;
inline constexpr size_t kMaxPayload = kMaxDatagram - kHeaderSize;
inline constexpr uint8_t kNumClasses = 4;

enum class MsgType : uint8_t {
  kPush = 1,       // worker -> aggregator: one chunk of a worker's contribution
  kResult = 2,     // aggregator -> worker: one chunk of the aggregate
  kPushNack = 3,   // aggregator -> worker: ranges of chunks to send again
  kResultReq = 4,  // worker -> aggregator: ranges of results still missing; kFlagDone when none are
  kProbe = 5,      // aggregator -> worker: "which results of this round do you still miss?"
  kError = 6,      // aggregator -> worker: the round cannot proceed; payload is a UTF-8 reason
  kManifest = 7,   // worker -> aggregator, bounded-loss rounds: the class of each chunk it pushes there
  kStop = 8,       // aggregator -> worker: the round is sealed; which of the worker's chunks were left out
};
inline constexpr uint8_t kMaxMsgType = 8;

inline constexpr uint8_t kFlagDone = 0x01;  // kResultReq: every result of the round has arrived
inline constexpr uint8_t kFlagMac = 0x02;   // an 8-byte MAC trailer follows the payload (mac.h)
// kResult: this worker's own contribution to the chunk is not in the sum (bounded loss); the
// worker keeps it for error feedback.
inline constexpr uint8_t kFlagLeftOut = 0x04;
// kPush: a repair (this chunk was pushed before). kResult: the chunk was lost somewhere on its
// way: a contribution to it came in a repair or was left out, or this result is itself sent
// again. Senders' loss detection needs it: a result that comes late after all, unflagged, was
// only reordered or delayed; flagged, it cost a repair (someone's loss at the switch port every
// worker shares), in the class Header::lost_class names.
inline constexpr uint8_t kFlagRepaired = 0x08;
inline constexpr uint8_t kKnownFlags = kFlagDone | kFlagMac | kFlagLeftOut | kFlagRepaired;
inline constexpr size_t kMacSize = 8;    // the trailer's length when kFlagMac is set

struct Header {
  MsgType type = MsgType::kPush;
  uint8_t priority = 0;  // class 0 (must deliver) .. 3
  uint8_t flags = 0;
  uint32_t job = 0;
  uint32_t key = 0;
  uint32_t round = 0;
  uint32_t chunk = 0;
  uint32_t chunk_count = 0;
  uint32_t tensor_elems = 0;
  uint16_t rank = 0;
  uint16_t contributors = 0;
  uint32_t epoch = 0;
  uint32_t payload_len = 0;
  // How PUSH and RESULT payloads write their values (payload_encoding.h); 0 (float32) otherwise.
  uint8_t encoding = 0;
  // With kFlagRepaired, where the loss was: on a PUSH, the class its first push rode (the repair
  // itself rides class 0); on a RESULT, the most important class in which a contribution to the
  // chunk was lost, or the class the result rode when it is sent again. Strict-priority switches
  // give each class its own queue, so a loss in a less important class than a worker's own push
  // says nothing about the queue that push took. 0 without the flag.
  uint8_t lost_class = 0;
};

// Why a datagram was dropped. Every value has a counter at the receiver.
enum class Reject : uint8_t {
  kNone = 0,
  kTruncated,
  kBadMagic,
  kBadVersion,
  kBadType,
  kBadClass,
  kBadFlags,
  kLengthMismatch,
  kBadChunk,
  kReservedSet,
  kBadPayload,
  // Set by receivers that check a header against their state:
  kUnknownJob,
  kNotMember,
  kStaleEpoch,
  kShapeMismatch,
  kUnknownRound,
  kOverCapacity,
  kJobFailed,
  kMissingMac,
  kBadMac,
  kBadEncoding,
  kUnknownSource,  // not from an address that may send it (a worker: its chunk's aggregator endpoint)
  kBadHostGroup,   // a PUSH's contributors name no host group its rank leads, or a bounded round
  kCount,
};
const char* RejectName(Reject r);

// Writes exactly kHeaderSize bytes (header_layout.h has the inline form the GPU packer uses).
void EncodeHeader(const Header& h, uint8_t* out);

// Parses and checks everything that does not need receiver state: magic, version, type, class,
// flags, encoding, reserved bytes, that payload_len (plus the MAC trailer, if flagged) matches the
// datagram, and chunk bounds. The MAC itself needs the key: see mac.h. Returns the
// reason on failure; `out` is only valid on kNone.
Reject ParseHeader(absl::Span<const uint8_t> datagram, Header* out);

}  // namespace dlcp::wire
