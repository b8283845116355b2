#include "common/wire/payload_encoding.h"

#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/simd.h"

namespace dlcp::wire {

const char* EncodingName(Encoding e) {
  switch (e) {
    case Encoding::kF32: return "f32";
    case Encoding::kF16: return "f16";
    case Encoding::kBF16: return "bf16";
  }
  return "unknown";
}

absl::StatusOr<Encoding> ParseEncoding(const std::string& name) {
  for (uint8_t i = 0; i < kNumEncodings; ++i) {
    if (name == EncodingName(static_cast<Encoding>(i))) return static_cast<Encoding>(i);
  }
  return absl::InvalidArgumentError(absl::StrCat("payload encoding '", name, "': expected f32, f16 or bf16"));
}

// Native 16-bit stores where the host is little-endian like the wire; AVX2 where the CPU has it.
// The indices are size_t: a uint32_t 2 * i may wrap, which kept the loops from vectorizing.
namespace {
template <uint16_t (*Convert)(float)>
inline void Narrow(const float* in, uint32_t n, uint8_t* out) {
  if constexpr (std::endian::native == std::endian::little) {
    for (size_t i = 0; i < n; ++i) {
      const uint16_t v = Convert(in[i]);
      std::memcpy(out + 2 * i, &v, 2);  // a plain store; the payload may sit at any address
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      const uint16_t v = Convert(in[i]);
      out[2 * i] = static_cast<uint8_t>(v);
      out[2 * i + 1] = static_cast<uint8_t>(v >> 8);
    }
  }
}
template <float (*Convert)(uint16_t)>
inline void Widen(const uint8_t* in, uint32_t n, float* out) {
  if constexpr (std::endian::native == std::endian::little) {
    for (size_t i = 0; i < n; ++i) {
      uint16_t v;
      std::memcpy(&v, in + 2 * i, 2);  // a plain load; the payload may sit at any address
      out[i] = Convert(v);
    }
  } else {
    for (size_t i = 0; i < n; ++i) out[i] = Convert(static_cast<uint16_t>(in[2 * i] | (in[2 * i + 1] << 8)));
  }
}
// Clang clones functions, not templates.
DLCP_AVX2_CLONES void WidenF16(const uint8_t* in, uint32_t n, float* out) {
  Widen<F16ToF32>(in, n, out);
}
DLCP_AVX2_CLONES void WidenBF16(const uint8_t* in, uint32_t n, float* out) {
  Widen<BF16ToF32>(in, n, out);
}
DLCP_AVX2_CLONES void NarrowF16(const float* in, uint32_t n, uint8_t* out) {
  Narrow<F32ToF16>(in, n, out);
}
DLCP_AVX2_CLONES void NarrowBF16(const float* in, uint32_t n, uint8_t* out) {
  Narrow<F32ToBF16>(in, n, out);
}
}  // namespace

void EncodeValues(const float* in, uint32_t n, Encoding e, uint8_t* out) {
  switch (e) {
    case Encoding::kF32:
      if constexpr (std::endian::native == std::endian::little) {
        std::memcpy(out, in, static_cast<size_t>(n) * 4);
      } else {
        for (uint32_t i = 0; i < n; ++i) StoreValue(out, i, Encoding::kF32, in[i]);
      }
      return;
    case Encoding::kF16:
      return NarrowF16(in, n, out);
    case Encoding::kBF16:
      return NarrowBF16(in, n, out);
  }
}

void DecodeValues(const uint8_t* in, uint32_t n, Encoding e, float* out) {
  switch (e) {
    case Encoding::kF32:
      if constexpr (std::endian::native == std::endian::little) {
        std::memcpy(out, in, static_cast<size_t>(n) * 4);
      } else {
        for (uint32_t i = 0; i < n; ++i) out[i] = LoadValue(in, i, Encoding::kF32);
      }
      return;
    case Encoding::kF16:
      return WidenF16(in, n, out);
    case Encoding::kBF16:
      return WidenBF16(in, n, out);
  }
}

}  // namespace dlcp::wire
