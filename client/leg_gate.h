// How much of a host stage's network leg is ready to go out (docs/host-stage.md). The stage's
// first worker sums a tensor larger than a slot step by step into one buffer and submits that
// buffer's round before the sum is done; the engine pushes each part as soon as it is summed, so
// the network round runs while the rest of the tensor is still being summed.
//
// Threading: Open and Abandon from the stage's thread; ready, abandoned, Attach and Detach from
// the engine's (Attach also from the submitting thread, before the op is in the engine).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>

#include "absl/status/status.h"

namespace dlcp {

class LegGate {
 public:
  explicit LegGate(uint64_t elems) : elems_(elems) {}
  LegGate(const LegGate&) = delete;
  LegGate& operator=(const LegGate&) = delete;

  // Elements [0, elems) hold their final sum (never fewer than before); wakes the engine.
  void Open(uint64_t elems);
  // The rest will never be summed (the stage lost a member, or is closing): the engine fails the
  // op with `why` instead of pushing a partial sum. Wakes the engine.
  void Abandon(const absl::Status& why);

  // How many elements, from the first, may go out.
  uint64_t ready() const { return ready_.load(std::memory_order_acquire); }
  bool complete() const { return ready() >= elems_; }
  absl::Status abandoned() const;
  // `wake` runs at each Open and Abandon until Detach (the op left the engine).
  void Attach(std::function<void()> wake);
  void Detach() { Attach(nullptr); }

 private:
  void Wake();

  const uint64_t elems_;
  std::atomic<uint64_t> ready_{0};
  mutable std::mutex mu_;  // guards what follows
  absl::Status abandoned_;
  std::function<void()> wake_;
};

}  // namespace dlcp
