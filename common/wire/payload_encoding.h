// How the float values of a PUSH or RESULT payload are written: float32, or float16 / bfloat16 to
// halve the bytes. The aggregator decodes and sums in float32 and answers in the round's encoding.
// Conversions round to nearest, ties to even, in integer arithmetic, so a host and a CUDA device
// produce the same bits (the GPU packer uses these very functions).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/statusor.h"
#include "common/base/hd.h"

namespace dlcp::wire {

enum class Encoding : uint8_t { kF32 = 0, kF16 = 1, kBF16 = 2 };
inline constexpr uint8_t kNumEncodings = 3;

DLCP_HD inline uint32_t EncodingWidth(Encoding e) { return e == Encoding::kF32 ? 4 : 2; }
const char* EncodingName(Encoding e);
absl::StatusOr<Encoding> ParseEncoding(const std::string& name);  // "f32", "f16" or "bf16"

DLCP_HD inline uint32_t FloatBits(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  return x;
}
DLCP_HD inline float BitsFloat(uint32_t x) {
  float f;
  memcpy(&f, &x, 4);
  return f;
}

// IEEE binary16. Overflow goes to infinity; a NaN stays a (quiet) NaN with its sign.
DLCP_HD inline uint16_t F32ToF16(float f) {
  uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return static_cast<uint16_t>(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (x >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65536
  if (x < 0x38800000u) {  // below the smallest normal half, 2^-14: a subnormal or zero
    if (x < 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25 rounds to zero
    const uint32_t shift = 126u - (x >> 23);  // 14..24
    const uint32_t m = (x & 0x7fffffu) | 0x800000u;
    uint32_t h = m >> shift;
    const uint32_t rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (h & 1u))) ++h;
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = (x >> 13) - (112u << 10);  // rebias the exponent from 127 to 15
  const uint32_t rest = x & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent is right
  return static_cast<uint16_t>(sign | h);
}

DLCP_HD inline float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    if (m == 0) return BitsFloat(sign);
    e = 113;
    while (!(m & 0x400u)) {
      m <<= 1;
      --e;
    }
    return BitsFloat(sign | (e << 23) | ((m & 0x3ffu) << 13));
  }
  if (e == 31) return BitsFloat(sign | 0x7f800000u | (m << 13));
  return BitsFloat(sign | ((e + 112u) << 23) | (m << 13));
}

// bfloat16: the top half of a float32, rounded. A NaN stays a quiet NaN.
DLCP_HD inline uint16_t F32ToBF16(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
DLCP_HD inline float BF16ToF32(uint16_t b) { return BitsFloat(static_cast<uint32_t>(b) << 16); }

// Value i of a payload in encoding e, and the other way; little-endian, byte by byte.
DLCP_HD inline float LoadValue(const uint8_t* payload, uint32_t i, Encoding e) {
  if (e == Encoding::kF32) {
    const uint8_t* p = payload + 4 * i;
    return BitsFloat(static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                     (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24));
  }
  const uint8_t* p = payload + 2 * i;
  const uint16_t v = static_cast<uint16_t>(p[0] | (p[1] << 8));
  return e == Encoding::kF16 ? F16ToF32(v) : BF16ToF32(v);
}
DLCP_HD inline void StoreValue(uint8_t* payload, uint32_t i, Encoding e, float f) {
  if (e == Encoding::kF32) {
    const uint32_t x = FloatBits(f);
    uint8_t* p = payload + 4 * i;
    for (int b = 0; b < 4; ++b) p[b] = static_cast<uint8_t>(x >> (8 * b));
    return;
  }
  const uint16_t v = e == Encoding::kF16 ? F32ToF16(f) : F32ToBF16(f);
  payload[2 * i] = static_cast<uint8_t>(v);
  payload[2 * i + 1] = static_cast<uint8_t>(v >> 8);
}

// Whole payloads (host only; the loops vectorize).
void EncodeValues(const float* in, uint32_t n, Encoding e, uint8_t* out);
void DecodeValues(const uint8_t* in, uint32_t n, Encoding e, float* out);

}  // namespace dlcp::wire
