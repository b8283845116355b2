// A single-producer, single-consumer ring of records in memory two processes share (a
// SharedRegion), and the doorbell that wakes its consumer. Lock-free: the producer owns the head
// index, the consumer the tail, each an atomic in the shared header; a record is a length and its
// bytes in a fixed-size slot.
//
// The memory is shared with another process, which may be buggy or hostile: nothing read from it
// is trusted. Attach checks the header against the memory's size once and keeps its own copy of
// the geometry; every index and length read later is checked, and a bad one is DATA_LOSS naming
// it, never an access outside the ring.
//
// Threading: one producer thread (in any process) calls TryPush and Doorbell::Ring; one consumer
// thread calls Peek, Pop and Doorbell::Wait. Format before either starts.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace dlcp {

// The ring's header, at the start of its memory. Host byte order: both sides are on one host.
struct RingHeader {
  static constexpr uint32_t kMagic = 0x676e7244;  // "Drng"
  static constexpr uint32_t kVersion = 1;
  uint32_t magic;
  uint32_t version;
  uint32_t slots;       // a power of two
  uint32_t slot_bytes;  // a multiple of 8, record length included
  uint8_t pad0[48];
  alignas(64) std::atomic<uint64_t> head;  // records pushed; written by the producer only
  uint8_t pad1[56];
  alignas(64) std::atomic<uint64_t> tail;  // records popped; written by the consumer only
  uint8_t pad2[56];
  alignas(64) std::atomic<uint32_t> consumer_asleep;  // 1 while the consumer waits on its doorbell
  uint8_t pad3[60];
};
static_assert(sizeof(RingHeader) == 256, "the ring header's layout is shared between processes");
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free,
              "atomics in shared memory must be lock-free");

class SpscRing {
 public:
  static constexpr size_t kLengthBytes = 8;  // each slot starts with the record's length

  // The memory a ring of `slots` slots of `slot_bytes` takes.
  static constexpr size_t BytesFor(uint32_t slots, uint32_t slot_bytes) {
    return sizeof(RingHeader) + size_t{slots} * slot_bytes;
  }
  // Writes an empty ring's header at `at` (the owner, before any peer attaches).
  // INVALID_ARGUMENT for a geometry that is not a power of two of 8-byte-multiple slots or that
  // does not fit in `bytes`.
  static absl::StatusOr<SpscRing> Format(void* at, size_t bytes, uint32_t slots, uint32_t slot_bytes);
  // A ring another process formatted at `at`; DATA_LOSS when its header does not describe a
  // ring that fits in `bytes`.
  static absl::StatusOr<SpscRing> Attach(void* at, size_t bytes);

  size_t max_record_bytes() const { return slot_bytes_ - kLengthBytes; }
  uint32_t slots() const { return slots_; }

  // Producer. Copies `record` into the next slot: false when the ring is full. INVALID_ARGUMENT
  // for a record over max_record_bytes(); DATA_LOSS when the consumer's index is impossible.
  absl::StatusOr<bool> TryPush(absl::Span<const uint8_t> record);

  // Consumer. The oldest record, in place (valid until Pop), or nullopt when the ring is empty.
  // DATA_LOSS when the producer's index or the record's length is impossible.
  absl::StatusOr<std::optional<absl::Span<const uint8_t>>> Peek();
  // Gives the oldest record's slot back to the producer.
  void Pop();

  // For Doorbell.
  RingHeader& header() const { return *header_; }
  bool EmptyForConsumer() const { return header_->head.load(std::memory_order_seq_cst) == tail_; }

 private:
  SpscRing(RingHeader* header, uint8_t* slots_at, uint32_t slots, uint32_t slot_bytes)
      : header_(header), slots_at_(slots_at), slots_(slots), slot_bytes_(slot_bytes) {}
  uint8_t* Slot(uint64_t index) const { return slots_at_ + (index & (slots_ - 1)) * size_t{slot_bytes_}; }

  RingHeader* header_;
  uint8_t* slots_at_;
  uint32_t slots_;
  uint32_t slot_bytes_;
  uint64_t tail_ = 0;  // the consumer's own copy: the shared one is only published
};

// How a ring's consumer sleeps and its producer wakes it: an eventfd (passed to the other process
// like the region), written only while the consumer says it is asleep, so a busy consumer costs the
// producer no system call.
class Doorbell {
 public:
  static absl::StatusOr<Doorbell> Create();
  // A descriptor a peer passed; this object owns it.
  static Doorbell Adopt(int fd) { return Doorbell(fd); }

  Doorbell(Doorbell&& other) noexcept;
  Doorbell& operator=(Doorbell&& other) noexcept;
  Doorbell(const Doorbell&) = delete;
  Doorbell& operator=(const Doorbell&) = delete;
  ~Doorbell();

  int fd() const { return fd_; }
  // Producer, after TryPush: wakes the consumer if it is asleep.
  void Ring(const SpscRing& ring) const;
  // Consumer: blocks until the ring holds a record (true) or `deadline` passes (false).
  absl::StatusOr<bool> Wait(const SpscRing& ring, absl::Time deadline) const;

 private:
  explicit Doorbell(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace dlcp
