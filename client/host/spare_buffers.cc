#include "client/host/spare_buffers.h"

#include <map>
#include <mutex>
#include <new>

#include "common/base/sanitizers.h"

namespace dlcp {

struct SpareBuffers::Spares {
  explicit Spares(size_t max) : max_spares(max) {}
  ~Spares() {
    for (auto& [capacity, buffer] : kept) {
      DLCP_UNPOISON_MEMORY(buffer, capacity * sizeof(float));
      delete[] buffer;
    }
  }
  const size_t max_spares;
  mutable std::mutex mu;
  std::multimap<uint64_t, float*> kept;  // by capacity, in elements
};

void SpareBuffers::GiveBack::operator()(float* buffer) const {
  float* dropped = nullptr;
  {
    std::lock_guard<std::mutex> lock(spares->mu);
    // A write through a pointer kept past this (an engine round still running, say) is reported
    // by AddressSanitizer as a use after free would be.
    DLCP_POISON_MEMORY(buffer, capacity * sizeof(float));
    spares->kept.emplace(capacity, buffer);
    if (spares->kept.size() > spares->max_spares) {  // the smallest goes: the largest serve every op
      auto smallest = spares->kept.begin();
      DLCP_UNPOISON_MEMORY(smallest->second, smallest->first * sizeof(float));
      dropped = smallest->second;
      spares->kept.erase(smallest);
    }
  }
  delete[] dropped;
}

SpareBuffers::SpareBuffers(size_t max_spares) : spares_(std::make_shared<Spares>(max_spares)) {}

SpareBuffers::Buffer SpareBuffers::Take(uint64_t elems) {
  {
    std::lock_guard<std::mutex> lock(spares_->mu);
    if (auto it = spares_->kept.lower_bound(elems); it != spares_->kept.end()) {
      const uint64_t capacity = it->first;
      float* buffer = it->second;
      spares_->kept.erase(it);
      DLCP_UNPOISON_MEMORY(buffer, capacity * sizeof(float));
      return Buffer(buffer, GiveBack{spares_, capacity});
    }
  }
  float* buffer = new (std::nothrow) float[elems];  // values unset: no page is touched here
  if (buffer == nullptr) return Buffer(nullptr, GiveBack{});
  return Buffer(buffer, GiveBack{spares_, elems});
}

uint64_t SpareBuffers::spare_bytes() const {
  std::lock_guard<std::mutex> lock(spares_->mu);
  uint64_t bytes = 0;
  for (const auto& [capacity, buffer] : spares_->kept) bytes += capacity * sizeof(float);
  return bytes;
}

}  // namespace dlcp
