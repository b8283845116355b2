// An Address that a rare writer (a join, a leave) replaces while data threads read it per packet
// without a lock: a sequence lock. Writers serialize on a mutex; a reader retries only while a
// write is in flight, yielding meanwhile. An IPv6 address does not fit one atomic word, which is
// why this is not a std::atomic<uint64_t>.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include "common/transport/address.h"

namespace dlcp {

class AtomicAddress {
 public:
  // Never blocks on a writer's mutex.
  std::optional<Address> Load() const {
    uint64_t w[kWords];
    for (;;) {
      const uint32_t before = seq_.load(std::memory_order_acquire);
      if (before & 1) {
        std::this_thread::yield();
        continue;
      }
      // Acquire: a word from a write in flight makes the sequence read after it differ.
      for (int i = 0; i < kWords; ++i) w[i] = words_[i].load(std::memory_order_acquire);
      if (seq_.load(std::memory_order_relaxed) == before) break;
    }
    if ((w[2] & kSet) == 0) return std::nullopt;
    Address a;
    std::memcpy(a.ipv6.data(), &w[0], 16);
    a.ipv4 = static_cast<uint32_t>(w[2]);
    a.port = static_cast<uint16_t>(w[2] >> 32);
    a.v6 = (w[2] & kV6) != 0;
    a.qpn = static_cast<uint32_t>(w[3]);
    return a;
  }

  // Sets `a` (clears, with nullopt) and returns what was there.
  std::optional<Address> Exchange(const std::optional<Address>& a) {
    std::lock_guard<std::mutex> lock(write_mu_);
    std::optional<Address> old = Load();
    uint64_t w[kWords] = {0, 0, 0, 0};
    if (a) {
      std::memcpy(&w[0], a->ipv6.data(), 16);
      w[2] = uint64_t{a->ipv4} | uint64_t{a->port} << 32 | (a->v6 ? kV6 : 0) | kSet;
      w[3] = a->qpn;
    }
    // Release on each word: a reader that sees one also sees the odd sequence stored before it.
    // (Release and acquire on the words, not fences: ThreadSanitizer models the one, not the other.)
    const uint32_t s = seq_.load(std::memory_order_relaxed);
    seq_.store(s + 1, std::memory_order_relaxed);
    for (int i = 0; i < kWords; ++i) words_[i].store(w[i], std::memory_order_release);
    seq_.store(s + 2, std::memory_order_release);
    return old;
  }

 private:
  static constexpr int kWords = 4;  // the IPv6 bytes; IPv4, port and flags; the queue pair
  static constexpr uint64_t kV6 = uint64_t{1} << 48;
  static constexpr uint64_t kSet = uint64_t{1} << 49;
  std::mutex write_mu_;
  std::atomic<uint32_t> seq_{0};
  std::atomic<uint64_t> words_[kWords] = {};
};

}  // namespace dlcp
