#include "common/shm/spsc_ring.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/syscall.h"
#include "common/transport/waker.h"

namespace dlcp {
namespace {

absl::Status CheckAligned(const void* at) {
  if (reinterpret_cast<uintptr_t>(at) % alignof(RingHeader) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("a ring must start on a ", alignof(RingHeader), "-byte boundary"));
  }
  return absl::OkStatus();
}

bool GoodGeometry(uint32_t slots, uint32_t slot_bytes) {
  return slots > 0 && (slots & (slots - 1)) == 0 && slot_bytes > SpscRing::kLengthBytes && slot_bytes % 8 == 0;
}

}  // namespace

absl::StatusOr<SpscRing> SpscRing::Format(void* at, size_t bytes, uint32_t slots, uint32_t slot_bytes) {
  if (absl::Status s = CheckAligned(at); !s.ok()) return s;
  if (!GoodGeometry(slots, slot_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("a ring needs a power of two of slots and slots of a multiple of 8 "
                                                   "bytes over ", kLengthBytes, "; not ", slots, " x ", slot_bytes));
  }
  if (BytesFor(slots, slot_bytes) > bytes) {
    return absl::InvalidArgumentError(absl::StrCat("a ring of ", slots, " x ", slot_bytes, " bytes needs ",
                                                   BytesFor(slots, slot_bytes), " bytes, not ", bytes));
  }
  auto* header = new (at) RingHeader{};
  header->magic = RingHeader::kMagic;
  header->version = RingHeader::kVersion;
  header->slots = slots;
  header->slot_bytes = slot_bytes;
  return SpscRing(header, static_cast<uint8_t*>(at) + sizeof(RingHeader), slots, slot_bytes);
}

absl::StatusOr<SpscRing> SpscRing::Attach(void* at, size_t bytes) {
  if (absl::Status s = CheckAligned(at); !s.ok()) return s;
  if (bytes < sizeof(RingHeader)) return absl::DataLossError("the ring's memory is smaller than its header");
  auto* header = static_cast<RingHeader*>(at);
  // Read once: the geometry used from here on is this copy, whatever the peer writes later.
  const uint32_t magic = header->magic, version = header->version;
  const uint32_t slots = header->slots, slot_bytes = header->slot_bytes;
  if (magic != RingHeader::kMagic || version != RingHeader::kVersion) {
    return absl::DataLossError(absl::StrCat("no ring of version ", RingHeader::kVersion, " here (magic ", magic,
                                            ", version ", version, ")"));
  }
  if (!GoodGeometry(slots, slot_bytes) || BytesFor(slots, slot_bytes) > bytes) {
    return absl::DataLossError(absl::StrCat("the ring's header describes ", slots, " x ", slot_bytes,
                                            " bytes, which do not fit its ", bytes, " bytes"));
  }
  SpscRing ring(header, static_cast<uint8_t*>(at) + sizeof(RingHeader), slots, slot_bytes);
  ring.tail_ = header->tail.load(std::memory_order_acquire);
  return ring;
}

absl::StatusOr<bool> SpscRing::TryPush(absl::Span<const uint8_t> record) {
  if (record.size() > max_record_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a record of ", record.size(), " bytes does not fit a ring slot's ", max_record_bytes()));
  }
  const uint64_t head = header_->head.load(std::memory_order_relaxed);  // ours: only we write it
  const uint64_t tail = header_->tail.load(std::memory_order_acquire);
  if (head - tail > slots_) {
    return absl::DataLossError(absl::StrCat("ring indices are impossible: head ", head, ", tail ", tail));
  }
  if (head - tail == slots_) return false;
  uint8_t* slot = Slot(head);
  const uint64_t length = record.size();
  std::memcpy(slot, &length, sizeof(length));
  if (!record.empty()) std::memcpy(slot + kLengthBytes, record.data(), record.size());
  // seq_cst, not release: Doorbell::Ring's read of consumer_asleep must not pass it (see Wait).
  header_->head.store(head + 1, std::memory_order_seq_cst);
  return true;
}

absl::StatusOr<std::optional<absl::Span<const uint8_t>>> SpscRing::Peek() {
  const uint64_t head = header_->head.load(std::memory_order_acquire);
  if (head == tail_) return std::nullopt;
  if (head - tail_ > slots_) {
    return absl::DataLossError(absl::StrCat("ring indices are impossible: head ", head, ", tail ", tail_));
  }
  const uint8_t* slot = Slot(tail_);
  uint64_t length;
  std::memcpy(&length, slot, sizeof(length));
  if (length > max_record_bytes()) {
    return absl::DataLossError(absl::StrCat("a ring record claims ", length, " bytes; a slot holds ",
                                            max_record_bytes()));
  }
  return absl::MakeConstSpan(slot + kLengthBytes, static_cast<size_t>(length));
}

void SpscRing::Pop() {
  ++tail_;
  header_->tail.store(tail_, std::memory_order_release);
}

absl::StatusOr<Doorbell> Doorbell::Create() {
  return Doorbell(DLCP_SYSCALL(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)));
}

Doorbell::Doorbell(Doorbell&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

Doorbell& Doorbell::operator=(Doorbell&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

Doorbell::~Doorbell() {
  if (fd_ >= 0) ::close(fd_);
}

void Doorbell::Ring(const SpscRing& ring) const {
  // After the push's seq_cst store of head: either the consumer's seq_cst store of its flag came
  // first and is seen here, or its later seq_cst load of head sees the push. No wake-up is lost.
  if (ring.header().consumer_asleep.load(std::memory_order_seq_cst) == 0) return;
  uint64_t one = 1;
  ssize_t unused = ::write(fd_, &one, sizeof(one));
  (void)unused;
}

absl::StatusOr<bool> Doorbell::Wait(const SpscRing& ring, absl::Time deadline) const {
  std::atomic<uint32_t>& asleep = ring.header().consumer_asleep;
  for (;;) {
    asleep.store(1, std::memory_order_seq_cst);
    if (!ring.EmptyForConsumer()) break;
    if (MonotonicNow() >= deadline) {
      asleep.store(0, std::memory_order_relaxed);
      return false;
    }
    pollfd p{fd_, POLLIN, 0};
    if (DLCP_RETRY_EINTR(::poll(&p, 1, PollTimeoutMs(deadline))) < 0) {
      asleep.store(0, std::memory_order_relaxed);
      return ErrnoToStatus(errno, "poll of a ring's doorbell");
    }
    uint64_t rung;
    ssize_t unused = ::read(fd_, &rung, sizeof(rung));  // clears it; EAGAIN when it was not rung
    (void)unused;
  }
  asleep.store(0, std::memory_order_relaxed);
  return true;
}

}  // namespace dlcp
