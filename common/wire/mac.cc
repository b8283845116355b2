#include "common/wire/mac.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include <highwayhash/c_bindings.h>

#include "absl/strings/str_cat.h"
#include "common/wire/endian.h"
#include "common/wire/header.h"

namespace dlcp::wire {
namespace {
uint64_t Hash(const MacKey& key, const uint8_t* bytes, size_t len) {
  return HighwayHash64(key.data(), reinterpret_cast<const char*>(bytes), len);
}
}  // namespace

absl::StatusOr<MacKey> NewMacKey() {
  MacKey key;
  uint8_t* p = reinterpret_cast<uint8_t*>(key.data());
  size_t got = 0;
  while (got < sizeof(key)) {
    ssize_t n = getrandom(p + got, sizeof(key) - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::InternalError(absl::StrCat("getrandom: ", std::strerror(errno)));
    got += static_cast<size_t>(n);
  }
  return key;
}

MacKey MacKeyFromBytes(absl::Span<const uint8_t> bytes32) {
  MacKey key{};
  if (bytes32.size() < 32) return key;
  for (size_t w = 0; w < 4; ++w) key[w] = GetLE64(bytes32.data() + 8 * w);
  return key;
}

std::array<uint8_t, 32> MacKeyToBytes(const MacKey& key) {
  std::array<uint8_t, 32> out;
  for (size_t w = 0; w < 4; ++w) PutLE64(out.data() + 8 * w, key[w]);
  return out;
}

MacKey DeriveMacKey(const MacKey& secret, KeyPurpose purpose, uint32_t index) {
  uint8_t in[20] = {'d', 'l', 'c', 'p', '-', 'k', 'd', 'f'};
  PutLE32(in + 8, static_cast<uint32_t>(purpose));
  PutLE32(in + 12, index);
  MacKey out;
  for (uint32_t w = 0; w < 4; ++w) {
    PutLE32(in + 16, w);
    out[w] = Hash(secret, in, sizeof(in));
  }
  return out;
}

uint64_t PayloadDigest(const MacKey& key, const uint8_t* payload, size_t payload_len) {
  return Hash(key, payload, payload_len);
}

void MacFromDigest(const MacKey& key, const uint8_t* header, uint64_t payload_digest, uint8_t* tag) {
  uint8_t buf[kHeaderSize + 8];
  std::memcpy(buf, header, kHeaderSize);
  PutLE64(buf + kHeaderSize, payload_digest);
  PutLE64(tag, Hash(key, buf, sizeof(buf)));
}

void ComputeMac(const MacKey& key, const uint8_t* header, const uint8_t* payload, size_t payload_len, uint8_t* tag) {
  MacFromDigest(key, header, PayloadDigest(key, payload, payload_len), tag);
}

bool VerifyMac(const MacKey& key, absl::Span<const uint8_t> d, size_t payload_len) {
  if (d.size() != kHeaderSize + payload_len + kMacSize) return false;
  uint8_t want[kMacSize];
  ComputeMac(key, d.data(), d.data() + kHeaderSize, payload_len, want);
  // Constant time, so timing does not reveal how much of a forged tag was right.
  uint8_t diff = 0;
  for (size_t i = 0; i < kMacSize; ++i) diff |= want[i] ^ d[kHeaderSize + payload_len + i];
  return diff == 0;
}

bool VerifyMacEither(const MacKey& key, const MacKey* previous, absl::Span<const uint8_t> datagram,
                     size_t payload_len) {
  return VerifyMac(key, datagram, payload_len) || (previous != nullptr && VerifyMac(*previous, datagram, payload_len));
}

}  // namespace dlcp::wire
