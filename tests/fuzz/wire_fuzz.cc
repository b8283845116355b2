// libFuzzer target for everything a receiver parses from the network: the header, and the range
// lists of NACK/RESULT_REQ payloads. Properties, beyond "no crash, no sanitizer report":
//  - an accepted header is consistent with the datagram it came from;
//  - re-encoding an accepted header reproduces the input's 48 bytes exactly (nothing is ignored);
//  - an accepted range list stays inside the tensor and re-encodes to the same bytes;
//  - MAC verification of any accepted datagram is memory-safe and rejects forged tags;
//  - an accepted manifest part or STOP stays inside the tensor and re-encodes to the same bytes;
//  - with RDMA built in, the GRH before each RDMA datagram parses safely, and an accepted source
//    is one IPv4 address with a DSCP in [0, 63].
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/base/build_config.h"
#if DLCP_WITH_RDMA
#include "common/transport/rdma/grh.h"
#endif

#include "common/wire/bounded.h"
#include "common/wire/header.h"
#include "common/wire/payload_encoding.h"
#include "common/wire/mac.h"
#include "common/wire/ranges.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dlcp::wire;
#if DLCP_WITH_RDMA
  if (size >= dlcp::rdma::kGrhBytes) {
    std::optional<dlcp::rdma::GrhSource> src = dlcp::rdma::ParseGrh(data);
    if (src && (src->dscp < 0 || src->dscp > 63)) __builtin_trap();
  }
#endif
  Header h;
  if (ParseHeader(absl::MakeConstSpan(data, size), &h) != Reject::kNone) return 0;
  const size_t trailer = (h.flags & kFlagMac) ? kMacSize : 0;
  if (h.payload_len + kHeaderSize + trailer != size || h.priority >= kNumClasses) __builtin_trap();
  if (trailer != 0) {
    // Verifying a forged tag must be safe, and must fail (a random tag matches with chance 2^-64).
    static const MacKey kKey = {0x0123456789abcdefULL, 1, 2, 3};
    if (VerifyMac(kKey, absl::MakeConstSpan(data, size), h.payload_len)) __builtin_trap();
  }
  uint8_t again[kHeaderSize];
  EncodeHeader(h, again);
  if (std::memcmp(again, data, kHeaderSize) != 0) __builtin_trap();
  if (h.type == MsgType::kPushNack || h.type == MsgType::kResultReq || h.type == MsgType::kProbe) {
    auto ranges = DecodeRanges(absl::MakeConstSpan(data + kHeaderSize, h.payload_len), h.chunk_count);
    if (ranges.ok()) {
      for (const ChunkRange& r : *ranges) {
        if (r.length == 0 || uint64_t{r.first} + r.length > h.chunk_count) __builtin_trap();
      }
      auto encoded = EncodeRanges(*ranges, h.payload_len + 8);
      if (encoded.size() != 1 || encoded[0].size() != h.payload_len ||
          std::memcmp(encoded[0].data(), data + kHeaderSize, h.payload_len) != 0) {
        __builtin_trap();
      }
    }
  }
  if (h.type == MsgType::kPush || h.type == MsgType::kResult) {
    // Any payload decodes; a 16-bit value survives float32 and back unchanged (NaNs stay NaN).
    const auto e = static_cast<Encoding>(h.encoding);
    const uint32_t n = h.payload_len / EncodingWidth(e);
    std::vector<float> values(n);
    DecodeValues(data + kHeaderSize, n, e, values.data());
    std::vector<uint8_t> back(h.payload_len);
    EncodeValues(values.data(), n, e, back.data());
    for (uint32_t i = 0; i < n && e != Encoding::kF32; ++i) {
      const float v = LoadValue(back.data(), i, e);
      if (v == v ? v != values[i] : values[i] == values[i]) __builtin_trap();
      if (v == v && std::memcmp(back.data() + 2 * i, data + kHeaderSize + 2 * i, 2) != 0 && v != 0) __builtin_trap();
    }
  }
  if (h.type == MsgType::kManifest) {
    auto m = DecodeManifest(absl::MakeConstSpan(data + kHeaderSize, h.payload_len), h.chunk_count);
    if (m.ok()) {
      if (uint64_t{m->first} + m->classes.size() > h.chunk_count || m->owned_total > h.chunk_count) __builtin_trap();
      for (uint8_t c : m->classes) {
        if (c >= kNumClasses && c != kNotHere) __builtin_trap();
      }
    }
  }
  if (h.type == MsgType::kStop) {
    auto s = DecodeStop(absl::MakeConstSpan(data + kHeaderSize, h.payload_len), h.chunk_count);
    if (s.ok()) {
      if (s->droppable_missing > s->droppable_total) __builtin_trap();
      auto encoded = EncodeStop(s->droppable_total, s->droppable_missing, s->left_out, h.payload_len + 8);
      if (encoded.size() != 1 || encoded[0].size() != h.payload_len ||
          std::memcmp(encoded[0].data(), data + kHeaderSize, h.payload_len) != 0) {
        __builtin_trap();
      }
    }
  }
  return 0;
}
