// How a tensor is cut into chunks. Sender and receiver derive the same geometry from
// (tensor_elems, chunk_bytes), so a header's shape fields can be checked exactly.
#pragma once

#include <cstdint>

namespace dlcp::wire {

struct ChunkGeometry {
  uint32_t tensor_elems = 0;
  uint32_t chunk_elems = 0;  // elements in every chunk but the last

  uint32_t chunk_count() const { return (tensor_elems + chunk_elems - 1) / chunk_elems; }
  uint64_t offset(uint32_t chunk) const { return static_cast<uint64_t>(chunk) * chunk_elems; }
  uint32_t elems(uint32_t chunk) const {
    uint64_t rest = tensor_elems - offset(chunk);
    return rest < chunk_elems ? static_cast<uint32_t>(rest) : chunk_elems;
  }
  uint32_t bytes(uint32_t chunk) const { return elems(chunk) * static_cast<uint32_t>(sizeof(float)); }
  // Payload bytes of `chunk` when each value takes `width` bytes (payload_encoding.h).
  uint32_t bytes(uint32_t chunk, uint32_t width) const { return elems(chunk) * width; }
};

}  // namespace dlcp::wire
