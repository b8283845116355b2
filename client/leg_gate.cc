#include "client/leg_gate.h"

#include <algorithm>
#include <utility>

namespace dlcp {

void LegGate::Open(uint64_t elems) {
  // Release: the engine's acquire load then sees the summed values it pushes.
  ready_.store(std::max(ready_.load(std::memory_order_relaxed), std::min(elems, elems_)), std::memory_order_release);
  Wake();
}

void LegGate::Abandon(const absl::Status& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (abandoned_.ok()) abandoned_ = why.ok() ? absl::CancelledError("host stage gave its network leg up") : why;
  }
  Wake();
}

absl::Status LegGate::abandoned() const {
  std::lock_guard<std::mutex> lock(mu_);
  return abandoned_;
}

void LegGate::Attach(std::function<void()> wake) {
  std::lock_guard<std::mutex> lock(mu_);
  wake_ = std::move(wake);
}

void LegGate::Wake() {
  // Under the lock: Detach, once it returns, guarantees the engine is not woken any more.
  std::lock_guard<std::mutex> lock(mu_);
  if (wake_) wake_();
}

}  // namespace dlcp
