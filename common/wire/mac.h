// Authentication of data packets: a 64-bit keyed HighwayHash tag over the header and payload,
// carried in an 8-byte trailer after the payload when the header's kFlagMac is set. The key is a
// job's secret at one aggregator (256 bits, from Join over the TLS control channel), so only the
// job's members can make packets the aggregator accepts, and only the aggregator the ones they
// accept. Pure functions; safe from any thread.
//
// tag = HH64(key, header[0..48) || le64(HH64(key, payload)))
// Hashing the payload on its own first keeps both inputs contiguous, so header and payload can
// stay in separate buffers on the send path (no copy).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/wire/header.h"

namespace dlcp::wire {

using MacKey = std::array<uint64_t, 4>;

// Fills a key from the kernel's random source.
absl::StatusOr<MacKey> NewMacKey();
MacKey MacKeyFromBytes(absl::Span<const uint8_t> bytes32);  // bytes32.size() must be 32
std::array<uint8_t, 32> MacKeyToBytes(const MacKey& key);

// `header` is the encoded 48-byte header (with kFlagMac set); writes kMacSize bytes to `tag`.
void ComputeMac(const MacKey& key, const uint8_t* header, const uint8_t* payload, size_t payload_len, uint8_t* tag);

// The same in two steps, for one payload sent under several headers (a result chunk to every
// worker): the payload is hashed once, each header's tag costs one short hash.
uint64_t PayloadDigest(const MacKey& key, const uint8_t* payload, size_t payload_len);
void MacFromDigest(const MacKey& key, const uint8_t* header, uint64_t payload_digest, uint8_t* tag);

// Per-worker keys (docs/security.md): keys derived from a job's secret at one aggregator, so that
// the secret itself never has to leave it. Each is HH64 keyed with the secret over a label, the
// purpose, `index` and the word's position, four times for 256 bits: a pseudo-random function of
// the secret, so holding one derived key tells nothing of the secret or of any other.
enum class KeyPurpose : uint32_t {
  kResults = 1,  // the aggregator signs what it sends the member of rank `index` with it
  kWorker = 2,   // the member of rank `index` signs with it; only the aggregator checks it
};
MacKey DeriveMacKey(const MacKey& secret, KeyPurpose purpose, uint32_t index);

// For a datagram whose parsed header has kFlagMac: true if its trailer matches.
bool VerifyMac(const MacKey& key, absl::Span<const uint8_t> datagram, size_t payload_len);
// Key rotation: true if the trailer matches under `key` or, when given, the key before it.
bool VerifyMacEither(const MacKey& key, const MacKey* previous, absl::Span<const uint8_t> datagram,
                     size_t payload_len);

}  // namespace dlcp::wire
