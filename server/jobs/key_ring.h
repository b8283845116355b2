// A job's data-plane keys at one aggregator, and their rotation (docs/security.md, "Key rotation").
// A rotation goes through three phases, so that no packet signed with either key is refused while
// it may still be on its way:
//   1. Rolling. A new key is drawn. Joins and heartbeats hand it out with the old one; a member
//      signs with the new key as soon as it holds it and accepts both. The aggregator accepts both
//      and still signs with the old key, which members that have not heard of the new one check.
//   2. Switched. Every joined member has said, in a heartbeat (or by joining), that it holds the
//      new key. The aggregator signs with it, and still accepts the old key for a grace period:
//      a push signed before its worker heard of the new key may still be in flight.
//   3. Settled. After the grace period the old key is dropped here, and heartbeats tell members to
//      drop it too. Only then can the next rotation start.
//
// Threading: Rotate, Holds and Advance run on control threads and serialize on the ring's mutex.
// Data threads call Current() once per packet: one atomic load, never blocking. Snapshots are
// immutable and kept for the ring's lifetime (under 200 bytes per phase), so a pointer a data
// thread loaded stays valid however long it is preempted.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/wire/mac.h"

namespace dlcp::server {

class KeyRing {
 public:
  struct Keys {
    uint32_t generation = 1;  // of `newest`; the job's first key is 1
    wire::MacKey newest{};
    std::optional<wire::MacKey> previous;  // still accepted (rolling, switched); absent once settled
    bool switched = true;  // the aggregator signs with `newest`; else (rolling) with `previous`

    const wire::MacKey& send() const { return switched ? newest : *previous; }
    // A datagram's MAC checks out under `newest` or, during a rotation, `previous`.
    bool Verify(absl::Span<const uint8_t> datagram, size_t payload_len) const;
  };

  KeyRing(const wire::MacKey& first, uint32_t world);
  KeyRing(const KeyRing&) = delete;
  KeyRing& operator=(const KeyRing&) = delete;

  const Keys& Current() const { return *current_.load(std::memory_order_acquire); }

  // Draws a new key and starts rolling it out. Returns false, changing nothing, while an earlier
  // rotation has not settled.
  absl::StatusOr<bool> Rotate(absl::Time now);
  // `rank` holds key `generation` (it signs with it and accepts it).
  void Holds(uint32_t rank, uint32_t generation);
  // Moves a rotation on: to switched once every rank in `joined` holds the newest key, to settled
  // `grace` after that. Returns true if the phase changed.
  bool Advance(const std::vector<bool>& joined, absl::Time now, absl::Duration grace);
  // When the newest key was drawn (the job's creation for its first key).
  absl::Time drawn() const;

 private:
  void Publish(Keys next);  // under mu_

  mutable std::mutex mu_;
  std::deque<Keys> history_;  // every snapshot ever published; the back one is current
  std::atomic<const Keys*> current_{nullptr};
  std::vector<uint32_t> held_;  // per rank: the newest generation it said it holds
  absl::Time drawn_;
  absl::Time switched_at_ = absl::InfinitePast();
};

}  // namespace dlcp::server
