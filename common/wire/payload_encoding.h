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

// IEEE binary16. Overflow goes to infinity; a NaN stays a (quiet) NaN with its sign. Written
// with selects rather than branches so that host loops vectorize (after F. Giesen's
// float_to_half_fast3_rtne); subnormals round through one float addition, which rounds to
// nearest even on the host and on a CUDA device alike.
DLCP_HD inline uint16_t F32ToF16(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  // Subnormal or zero: adding 2^-1 aligns the 10 result bits at the bottom of the mantissa.
  const uint32_t sub = FloatBits(BitsFloat(a) + BitsFloat(126u << 23)) - (126u << 23);
  // Normal: rebias the exponent and round on the 13 bits that go.
  const uint32_t norm = (a + (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
  const uint32_t special = a > 0x7f800000u ? 0x7e00u : 0x7c00u;  // >= 65536: infinity; NaN
  const uint32_t h = a >= 0x47800000u ? special : (a < 0x38800000u ? sub : norm);
  return static_cast<uint16_t>(sign | h);
}

DLCP_HD inline float F16ToF32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h & 0x7fffu) << 13;
  const uint32_t exp = bits & (0x7c00u << 13);
  const uint32_t normal = bits + (112u << 23);  // rebias 15 -> 127
  // A subnormal: its mantissa as a normal number of exponent -14, less that normal's offset.
  const uint32_t subnormal = FloatBits(BitsFloat(normal + (1u << 23)) - BitsFloat(113u << 23));
  const uint32_t special = normal + (112u << 23);  // infinity / NaN: exponent all ones
  const uint32_t out = exp == (0x7c00u << 13) ? special : (exp == 0 ? subnormal : normal);
  return BitsFloat(out | (static_cast<uint32_t>(h & 0x8000u) << 16));
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
