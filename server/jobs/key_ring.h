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
// Each generation is a secret drawn here. With per-worker keys (the default), the secret never
// leaves the aggregator: each member gets two keys derived from it for its rank alone
// (wire::DeriveMacKey), one that signs what it sends and one that checks what the aggregator sends
// it. So no member can push as another, nor forge a result to another.
//
// Threading: Rotate, Holds and Advance run on control threads and serialize on the ring's mutex.
// Data threads call Current() once per packet: one atomic load, never blocking. Snapshots are
// immutable and kept for the ring's lifetime (a few dozen bytes per phase; the keys of a
// generation, 64 bytes per rank, are shared by its snapshots), so a pointer a data thread loaded
// stays valid however long it is preempted.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
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
  // One generation's secret and the keys derived from it.
  struct Generation {
    wire::MacKey secret{};
    // By rank; both empty without per-worker keys, when every member uses `secret` for both.
    std::vector<wire::MacKey> workers;  // what each member signs with
    std::vector<wire::MacKey> results;  // what the aggregator signs what it sends each member with

    static std::shared_ptr<const Generation> Make(const wire::MacKey& secret, uint32_t world, bool per_worker);
    // nullptr for a rank the job does not have.
    const wire::MacKey* worker(uint32_t rank) const;
    const wire::MacKey* result(uint32_t rank) const;
  };

  struct Keys {
    uint32_t generation = 1;  // of `newest`; the job's first key is 1
    std::shared_ptr<const Generation> newest;
    std::shared_ptr<const Generation> previous;  // still accepted (rolling, switched); null once settled
    bool switched = true;  // the aggregator signs with `newest`; else (rolling) with `previous`

    // What the aggregator signs packets to rank `rank` with; nullptr for a rank the job does not have.
    const wire::MacKey* send(uint32_t rank) const { return (switched ? newest : previous)->result(rank); }
    // A datagram from rank `rank` checks out under that rank's key of `newest` or, during a
    // rotation, of `previous`.
    bool Verify(absl::Span<const uint8_t> datagram, size_t payload_len, uint32_t rank) const;
  };

  // `per_worker`: derive the keys members get from each secret (above); false hands every member
  // the secret itself, for clients from before per-worker keys.
  KeyRing(const wire::MacKey& first, uint32_t world, bool per_worker = true);
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
  const uint32_t world_;
  const bool per_worker_;
  std::vector<uint32_t> held_;  // per rank: the newest generation it said it holds
  absl::Time drawn_;
  absl::Time switched_at_ = absl::InfinitePast();
};

}  // namespace dlcp::server
