// Host buffers of whole tensors for a host stage's ops larger than a slot (HostStage), kept once
// let go for the next op: a trainer all-reduces the same gradient buckets every iteration, so in
// the steady state an op neither allocates nor takes page faults for its sum.
//
// Threading: Take from any thread. A buffer goes back from whichever thread lets it go (the
// engine's, when a network round ends last), even after the SpareBuffers that gave it is gone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace dlcp {

class SpareBuffers {
 public:
  struct Spares;  // the kept buffers, shared with the buffers given out
  struct GiveBack {
    std::shared_ptr<Spares> spares;
    uint64_t capacity = 0;  // in elements
    void operator()(float* buffer) const;
  };
  using Buffer = std::unique_ptr<float[], GiveBack>;

  // Keeps at most `max_spares` buffers, the largest.
  explicit SpareBuffers(size_t max_spares);

  // A buffer of at least `elems` floats, its values unset: the smallest kept one that holds them,
  // or a new one. Null when there is no memory for it.
  Buffer Take(uint64_t elems);
  // Bytes kept, not given out.
  uint64_t spare_bytes() const;

 private:
  std::shared_ptr<Spares> spares_;
};

}  // namespace dlcp
