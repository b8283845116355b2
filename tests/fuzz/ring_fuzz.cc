// libFuzzer target for what a ring's consumer and producer read from memory another process
// writes: the header at Attach, then the indices and record lengths. The input is the ring's
// memory as a hostile peer left it. Properties, beyond "no crash, no sanitizer report":
//  - an attached ring's geometry fits the memory it was given;
//  - every record Peek returns lies inside that memory, and within one slot;
//  - a push either fits the ring's own geometry or is refused.
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/shm/spsc_ring.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using dlcp::SpscRing;
  // 64-byte aligned, as rings are placed; a copy, since the ring writes its indices back.
  std::vector<uint64_t> memory((size + 63) / 64 * 8 + 8);
  uint8_t* base = reinterpret_cast<uint8_t*>(memory.data());
  base += (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64;
  std::memcpy(base, data, size);
  auto ring = SpscRing::Attach(base, size);
  if (!ring.ok()) return 0;
  if (SpscRing::BytesFor(ring->slots(), static_cast<uint32_t>(ring->max_record_bytes() + SpscRing::kLengthBytes)) >
      size) {
    __builtin_trap();
  }
  for (int i = 0; i < 64; ++i) {
    auto record = ring->Peek();
    if (!record.ok() || !record->has_value()) break;
    const uint8_t* begin = (*record)->data();
    if (begin < base || begin + (*record)->size() > base + size || (*record)->size() > ring->max_record_bytes()) {
      __builtin_trap();
    }
    ring->Pop();
  }
  const uint8_t payload[16] = {};
  for (int i = 0; i < 64; ++i) {
    auto pushed = ring->TryPush(payload);
    if (!pushed.ok() || !*pushed) break;
  }
  return 0;
}
