// float16 / bfloat16 payload conversions: exact round trips, round-to-nearest-even against an
// independent reference, and the special values.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/wire/payload_encoding.h"

namespace dlcp::wire {
namespace {

// The value of a binary16 bit pattern, computed from its definition (not by F16ToF32).
double HalfValue(uint16_t h) {
  const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1 : 1;
  if (e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m, -24);
  return sign * std::ldexp(1024 + m, e - 25);
}

// Round-to-nearest-even by search over the finite halves: the reference for F32ToF16.
uint16_t NearestHalf(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isnan(f)) return sign | 0x7e00;  // a quiet NaN that keeps its sign
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7c00;
  uint16_t best = 0;
  for (uint16_t h = 1; h < 0x7c00; ++h) {
    const double d = std::fabs(HalfValue(h) - a), b = std::fabs(HalfValue(best) - a);
    if (d < b || (d == b && (h & 1) == 0)) best = h;
  }
  return sign | best;
}

TEST(PayloadEncoding, EveryHalfRoundTripsAndDecodesToItsValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = F16ToF32(static_cast<uint16_t>(h));
    const double want = HalfValue(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f)) << h;
      EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(f)))) << h;
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), want) << h;
    ASSERT_EQ(F32ToF16(f), h) << h;
  }
}

TEST(PayloadEncoding, HalfRoundsToNearestEven) {
  // Midpoints between neighbouring halves go to the even one; just above goes up.
  for (uint16_t h : {uint16_t{0x0001}, uint16_t{0x03ff}, uint16_t{0x0400}, uint16_t{0x3c00}, uint16_t{0x3c01},
                     uint16_t{0x7bfe}}) {
    const double mid = (HalfValue(h) + HalfValue(h + 1)) / 2;
    const float f = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(f), mid);  // exact in float
    EXPECT_EQ(F32ToF16(f), (h & 1) ? h + 1 : h) << h;
    EXPECT_EQ(F32ToF16(std::nextafter(f, INFINITY)), h + 1) << h;
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 3000; ++i) {
    uint32_t x = bits(rng);
    // Bias towards the half range, where the rounding happens.
    if (i % 2) x = (x & 0x80000000u) | (0x33000000u + x % (0x47800000u - 0x33000000u));
    const float f = BitsFloat(x);
    ASSERT_EQ(F32ToF16(f), NearestHalf(f)) << std::hex << x;
  }
  EXPECT_EQ(F32ToF16(65519.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);
  EXPECT_EQ(F32ToF16(-1e30f), 0xfc00);
  EXPECT_EQ(F32ToF16(-0.0f), 0x8000);
  EXPECT_EQ(F32ToF16(1e-9f), 0);  // below half the smallest subnormal
}

TEST(PayloadEncoding, BFloat16RoundsToNearestEven) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 100000; ++i) {
    const uint32_t x = bits(rng);
    const float f = BitsFloat(x);
    const uint16_t b = F32ToBF16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(BF16ToF32(b)));
      continue;
    }
    // The two candidates are the truncation and the next bfloat16 up in magnitude.
    const uint16_t lo = static_cast<uint16_t>(x >> 16), hi = static_cast<uint16_t>(lo + 1);
    const double dl = std::fabs(static_cast<double>(BF16ToF32(lo)) - f);
    const double dh = std::isinf(BF16ToF32(hi)) && !std::isinf(BF16ToF32(lo))
                          ? std::fabs(std::ldexp(1.0, 128) * (std::signbit(f) ? -1 : 1) - f)
                          : std::fabs(static_cast<double>(BF16ToF32(hi)) - f);
    const uint16_t want = dl < dh ? lo : dh < dl ? hi : ((lo & 1) ? hi : lo);
    ASSERT_EQ(b, want) << std::hex << x;
  }
  EXPECT_EQ(F32ToBF16(1.0f), 0x3f80);
  EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(PayloadEncoding, PayloadsAreLittleEndianAndRoundTrip) {
  const std::vector<float> values = {1.0f, -2.5f, 0.0f, 1024.0f, 3.0f};
  for (Encoding e : {Encoding::kF32, Encoding::kF16, Encoding::kBF16}) {
    std::vector<uint8_t> bytes(values.size() * EncodingWidth(e));
    EncodeValues(values.data(), static_cast<uint32_t>(values.size()), e, bytes.data());
    std::vector<float> back(values.size());
    DecodeValues(bytes.data(), static_cast<uint32_t>(values.size()), e, back.data());
    EXPECT_EQ(back, values) << EncodingName(e);  // all exact in every encoding
  }
  uint8_t one[2];
  StoreValue(one, 0, Encoding::kF16, 1.0f);  // 0x3c00
  EXPECT_EQ(one[0], 0x00);
  EXPECT_EQ(one[1], 0x3c);
}

// The whole-payload conversions are vectorized loops (AVX2 clones where the CPU has them); each
// value must come out bit for bit as the one-value functions make it, which the CUDA packer uses:
// every half, random float patterns with the specials, NaN payloads among them, odd lengths (the
// loops' scalar tails) and payloads at odd addresses.
TEST(PayloadEncoding, WholePayloadsConvertEachValueAsTheOneValueFunctionsDo) {
  std::vector<float> floats;
  for (uint32_t x : {0x7fc00001u, 0xffa00000u, 0x7f800001u, 0x7f800000u, 0xff800000u, 0x00000001u, 0x80000000u,
                     0x477ff000u, 0x477fefffu, 0x33000000u, 0x33000001u, 0x387fe000u}) {
    floats.push_back(BitsFloat(x));
  }
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> bits;
  while (floats.size() < 100003) {
    const uint32_t x = bits(rng);
    floats.push_back(BitsFloat(floats.size() % 2 ? x : (x & 0x80000000u) | (0x30000000u + x % 0x18000000u)));
  }
  for (Encoding e : {Encoding::kF16, Encoding::kBF16}) {
    for (uint32_t n : {uint32_t{0x10000}, uint32_t{0xffff}, uint32_t{13}}) {
      // Decode: every 16-bit pattern, from an odd address.
      std::vector<uint8_t> in(2 * n + 1);
      for (uint32_t i = 0; i < n; ++i) {
        in[1 + 2 * i] = static_cast<uint8_t>(i);
        in[2 + 2 * i] = static_cast<uint8_t>(i >> 8);
      }
      std::vector<float> out(n);
      DecodeValues(in.data() + 1, n, e, out.data());
      for (uint32_t i = 0; i < n; ++i) {
        const float want = e == Encoding::kF16 ? F16ToF32(static_cast<uint16_t>(i)) : BF16ToF32(static_cast<uint16_t>(i));
        ASSERT_EQ(FloatBits(out[i]), FloatBits(want)) << EncodingName(e) << " " << i << " of " << n;
      }
    }
    for (size_t n : {floats.size(), floats.size() - 1, size_t{7}}) {
      // Encode: into an odd address.
      std::vector<uint8_t> out(2 * n + 1);
      EncodeValues(floats.data(), static_cast<uint32_t>(n), e, out.data() + 1);
      for (size_t i = 0; i < n; ++i) {
        const uint16_t got = static_cast<uint16_t>(out[1 + 2 * i] | (out[2 + 2 * i] << 8));
        const uint16_t want = e == Encoding::kF16 ? F32ToF16(floats[i]) : F32ToBF16(floats[i]);
        ASSERT_EQ(got, want) << EncodingName(e) << " " << std::hex << FloatBits(floats[i]) << " at " << std::dec << i;
      }
    }
  }
}

TEST(PayloadEncoding, NamesParse) {
  for (uint8_t i = 0; i < kNumEncodings; ++i) {
    EXPECT_EQ(*ParseEncoding(EncodingName(static_cast<Encoding>(i))), static_cast<Encoding>(i));
  }
  EXPECT_FALSE(ParseEncoding("fp8").ok());
}

}  // namespace
}  // namespace dlcp::wire
