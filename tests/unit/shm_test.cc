// The shared-memory building blocks of the host stage: sealed regions, the SPSC ring and its
// doorbell, within a process, between threads (also under TSan) and between processes; and the
// hand-over of their descriptors over a Unix socket, with the peer's credentials.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "common/shm/descriptor_passing.h"
#include "common/shm/shared_region.h"
#include "common/shm/spsc_ring.h"
#include "gtest/gtest.h"

namespace dlcp {
namespace {

absl::Span<const uint8_t> Bytes(const uint64_t& v) { return {reinterpret_cast<const uint8_t*>(&v), sizeof(v)}; }

uint64_t Value(absl::Span<const uint8_t> record) {
  uint64_t v = 0;
  std::memcpy(&v, record.data(), std::min(record.size(), sizeof(v)));
  return v;
}

TEST(SharedRegion, IsSealedAtItsSizeAndMapsInAPeer) {
  auto region = SharedRegion::Create("test", 10000);
  ASSERT_TRUE(region.ok()) << region.status();
  EXPECT_EQ(region->size() % static_cast<size_t>(::sysconf(_SC_PAGESIZE)), 0u);
  EXPECT_GE(region->size(), 10000u);
  std::memset(region->data(), 0x5a, 100);
  auto peer = SharedRegion::Map(::dup(region->fd()), 10000);
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_EQ(static_cast<uint8_t*>(peer->data())[99], 0x5a);
  static_cast<uint8_t*>(peer->data())[5000] = 7;  // one memory, not two copies
  EXPECT_EQ(static_cast<uint8_t*>(region->data())[5000], 7);
  // Neither side can shrink or grow it (a shrink would SIGBUS the other), nor unseal it.
  EXPECT_NE(::ftruncate(region->fd(), 0), 0);
  EXPECT_NE(::ftruncate(peer->fd(), 1 << 20), 0);
  EXPECT_NE(::fcntl(region->fd(), F_ADD_SEALS, F_SEAL_WRITE), 0);
  auto too_small = SharedRegion::Map(::dup(region->fd()), region->size() + 1);
  EXPECT_EQ(too_small.status().code(), absl::StatusCode::kFailedPrecondition) << too_small.status();
}

TEST(SharedRegion, RefusesADescriptorThatIsNotASealedMemfd) {
  const int unsealed = ::memfd_create("unsealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(unsealed, 0);
  ASSERT_EQ(::ftruncate(unsealed, 4096), 0);
  auto mapped = SharedRegion::Map(unsealed, 4096);
  EXPECT_EQ(mapped.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(mapped.status().message().find("not a sealed memfd"), std::string::npos) << mapped.status();
  auto pipe_end = SharedRegion::Map(::open("/dev/null", O_RDWR | O_CLOEXEC), 0);
  EXPECT_EQ(pipe_end.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(SharedRegion::Create("empty", 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SpscRing, RecordsComeOutInOrderAcrossWrapAroundAndAFullRingSaysSo) {
  alignas(64) static uint8_t memory[SpscRing::BytesFor(8, 64)];
  auto ring = SpscRing::Format(memory, sizeof(memory), 8, 64);
  ASSERT_TRUE(ring.ok()) << ring.status();
  EXPECT_EQ(ring->max_record_bytes(), 56u);
  uint64_t next_in = 0, next_out = 0;
  for (int round = 0; round < 300; ++round) {
    const int burst = 1 + round % 8;
    for (int i = 0; i < burst; ++i) {
      std::vector<uint8_t> record(8 + next_in % 49, static_cast<uint8_t>(next_in));
      std::memcpy(record.data(), &next_in, sizeof(next_in));
      auto pushed = ring->TryPush(record);
      ASSERT_TRUE(pushed.ok() && *pushed) << round;
      ++next_in;
    }
    if (burst == 8) {
      auto full = ring->TryPush(Bytes(next_in));
      ASSERT_TRUE(full.ok());
      EXPECT_FALSE(*full) << "a ring of 8 took a 9th record";
    }
    for (int i = 0; i < burst; ++i) {
      auto record = ring->Peek();
      ASSERT_TRUE(record.ok() && record->has_value()) << round;
      EXPECT_EQ(Value(**record), next_out);
      EXPECT_EQ((*record)->size(), 8 + next_out % 49);
      if ((*record)->size() > 8) {
        EXPECT_EQ((*record)->back(), static_cast<uint8_t>(next_out));
      }
      ring->Pop();
      ++next_out;
    }
    auto empty = ring->Peek();
    ASSERT_TRUE(empty.ok());
    EXPECT_FALSE(empty->has_value());
  }
  std::vector<uint8_t> too_big(57);
  EXPECT_EQ(ring->TryPush(too_big).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SpscRing, BadGeometryIsRefusedAndACorruptPeerIsDataLossNotACrash) {
  alignas(64) static uint8_t memory[SpscRing::BytesFor(4, 32)];
  EXPECT_EQ(SpscRing::Format(memory, sizeof(memory), 3, 32).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SpscRing::Format(memory, sizeof(memory), 4, 36).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SpscRing::Format(memory, sizeof(memory), 8, 32).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SpscRing::Format(memory + 8, sizeof(memory) - 8, 4, 16).status().code(),
            absl::StatusCode::kInvalidArgument);  // not on a 64-byte boundary
  auto producer = SpscRing::Format(memory, sizeof(memory), 4, 32);
  ASSERT_TRUE(producer.ok());
  auto consumer = SpscRing::Attach(memory, sizeof(memory));
  ASSERT_TRUE(consumer.ok()) << consumer.status();
  uint64_t v = 42;
  ASSERT_TRUE(*producer->TryPush(Bytes(v)));
  RingHeader& header = producer->header();
  // A record length past its slot.
  uint64_t huge = 1 << 20;
  std::memcpy(memory + sizeof(RingHeader), &huge, sizeof(huge));
  EXPECT_EQ(consumer->Peek().status().code(), absl::StatusCode::kDataLoss);
  // A head index far past the tail, and a tail past the head.
  header.head.store(1000);
  EXPECT_EQ(consumer->Peek().status().code(), absl::StatusCode::kDataLoss);
  header.head.store(1);
  header.tail.store(5);
  EXPECT_EQ(producer->TryPush(Bytes(v)).status().code(), absl::StatusCode::kDataLoss);
  // A header that is not a ring, or whose geometry overruns its memory.
  header.slots = 1 << 20;
  EXPECT_EQ(SpscRing::Attach(memory, sizeof(memory)).status().code(), absl::StatusCode::kDataLoss);
  header.magic = 0;
  EXPECT_EQ(SpscRing::Attach(memory, sizeof(memory)).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(SpscRing::Attach(memory, 100).status().code(), absl::StatusCode::kDataLoss);
}

TEST(Doorbell, WaitEndsAtItsDeadlineOnAnEmptyRing) {
  alignas(64) static uint8_t memory[SpscRing::BytesFor(4, 32)];
  auto ring = SpscRing::Format(memory, sizeof(memory), 4, 32);
  auto bell = Doorbell::Create();
  ASSERT_TRUE(ring.ok() && bell.ok());
  const absl::Time start = MonotonicNow();
  auto woke = bell->Wait(*ring, start + absl::Milliseconds(60));
  ASSERT_TRUE(woke.ok()) << woke.status();
  EXPECT_FALSE(*woke);
  EXPECT_GE(MonotonicNow() - start, absl::Milliseconds(60));
  EXPECT_LT(MonotonicNow() - start, absl::Seconds(2));
  EXPECT_EQ(ring->header().consumer_asleep.load(), 0u);
}

// Streams `count` numbered records from a producer to a consumer that sleeps on the doorbell
// whenever the ring is empty; a lost wake-up shows as a Wait that reaches its deadline.
void Produce(SpscRing ring, const Doorbell& bell, uint64_t count) {
  const absl::Time deadline = MonotonicNow() + absl::Seconds(30);  // a consumer that stopped
  for (uint64_t i = 0; i < count; ++i) {
    for (;;) {
      auto pushed = ring.TryPush(Bytes(i));
      ASSERT_TRUE(pushed.ok()) << pushed.status();
      if (*pushed) break;
      ASSERT_LT(MonotonicNow(), deadline) << "record " << i << " found the ring full for 30 s";
      std::this_thread::yield();  // full: the consumer is behind
    }
    bell.Ring(ring);
  }
}

void Consume(SpscRing ring, const Doorbell& bell, uint64_t count) {
  for (uint64_t i = 0; i < count;) {
    auto record = ring.Peek();
    ASSERT_TRUE(record.ok()) << record.status();
    if (!record->has_value()) {
      auto woke = bell.Wait(ring, MonotonicNow() + absl::Seconds(10));
      ASSERT_TRUE(woke.ok() && *woke) << "record " << i << " never came: a lost wake-up";
      continue;
    }
    ASSERT_EQ(Value(**record), i);
    ring.Pop();
    ++i;
  }
}

TEST(Doorbell, TwoThreadsStreamInOrderWithoutLosingAWakeup) {
  auto region = SharedRegion::Create("threads", SpscRing::BytesFor(16, 16));
  ASSERT_TRUE(region.ok());
  auto producer = SpscRing::Format(region->data(), region->size(), 16, 16);
  auto consumer = SpscRing::Attach(region->data(), region->size());
  auto bell = Doorbell::Create();
  ASSERT_TRUE(producer.ok() && consumer.ok() && bell.ok());
  constexpr uint64_t kCount = 100000;
  std::thread t([&] { Produce(*producer, *bell, kCount); });
  Consume(*consumer, *bell, kCount);
  t.join();
}

TEST(Doorbell, TwoProcessesStreamThroughAPassedRegionAndDoorbell) {
  auto region = SharedRegion::Create("processes", SpscRing::BytesFor(64, 64));
  auto bell = Doorbell::Create();
  ASSERT_TRUE(region.ok() && bell.ok());
  auto consumer = SpscRing::Format(region->data(), region->size(), 64, 64);
  ASSERT_TRUE(consumer.ok());
  constexpr uint64_t kCount = 20000;
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The child maps the region and adopts the doorbell as a peer that received them would.
    auto mapped = SharedRegion::Map(::dup(region->fd()), region->size());
    absl::StatusOr<SpscRing> producer =
        mapped.ok() ? SpscRing::Attach(mapped->data(), mapped->size()) : absl::StatusOr<SpscRing>(mapped.status());
    if (!producer.ok()) ::_exit(2);
    Doorbell peer_bell = Doorbell::Adopt(::dup(bell->fd()));
    Produce(*producer, peer_bell, kCount);
    ::_exit(::testing::Test::HasFailure() ? 1 : 0);
  }
  Consume(*consumer, *bell, kCount);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

size_t OpenDescriptors() {
  size_t n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  while (d != nullptr && ::readdir(d) != nullptr) ++n;
  if (d != nullptr) ::closedir(d);
  return n;
}

struct SocketPair {
  SocketPair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds), 0);
    a = OwnedFd(fds[0]);
    b = OwnedFd(fds[1]);
  }
  OwnedFd a, b;
};

TEST(DescriptorPassing, ARegionAndDoorbellPassedOverASocketWorkOnTheOtherSide) {
  SocketPair s;
  auto region = SharedRegion::Create("passed", SpscRing::BytesFor(8, 64));
  auto bell = Doorbell::Create();
  ASSERT_TRUE(region.ok() && bell.ok());
  auto producer = SpscRing::Format(region->data(), region->size(), 8, 64);
  ASSERT_TRUE(producer.ok());
  const uint8_t hello[] = {'r', 'i', 'n', 'g'};
  const int fds[] = {region->fd(), bell->fd()};
  ASSERT_TRUE(SendWithDescriptors(s.a.get(), hello, fds).ok());
  auto got = ReceiveWithDescriptors(s.b.get(), 64, MonotonicNow() + absl::Seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->message, std::vector<uint8_t>(hello, hello + 4));
  ASSERT_EQ(got->fds.size(), 2u);
  EXPECT_NE(got->fds[0].get(), region->fd());  // a new descriptor of the same memfd
  EXPECT_EQ(::fcntl(got->fds[0].get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  auto mapped = SharedRegion::Map(got->fds[0].Release(), region->size());
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  auto consumer = SpscRing::Attach(mapped->data(), mapped->size());
  ASSERT_TRUE(consumer.ok()) << consumer.status();
  Doorbell passed_bell = Doorbell::Adopt(got->fds[1].Release());
  uint64_t v = 77;
  ASSERT_TRUE(*producer->TryPush(Bytes(v)));
  bell->Ring(*producer);
  auto woke = passed_bell.Wait(*consumer, MonotonicNow() + absl::Seconds(5));
  ASSERT_TRUE(woke.ok() && *woke);
  auto record = consumer->Peek();
  ASSERT_TRUE(record.ok() && record->has_value());
  EXPECT_EQ(Value(**record), 77u);
}

TEST(DescriptorPassing, ThePeerIsKnownAndFailuresAreNamedWithoutLeakingDescriptors) {
  SocketPair s;
  auto peer = PeerOf(s.b.get());
  ASSERT_TRUE(peer.ok()) << peer.status();
  EXPECT_EQ(peer->pid, ::getpid());
  EXPECT_EQ(peer->uid, ::getuid());
  EXPECT_EQ(peer->gid, ::getgid());
  // Nothing sent: the wait ends at its deadline.
  auto silent = ReceiveWithDescriptors(s.b.get(), 64, MonotonicNow() + absl::Milliseconds(50));
  EXPECT_EQ(silent.status().code(), absl::StatusCode::kDeadlineExceeded) << silent.status();
  const uint8_t byte[] = {1};
  std::vector<int> nine(kMaxPassedDescriptors + 1, s.a.get());
  EXPECT_EQ(SendWithDescriptors(s.a.get(), byte, nine).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SendWithDescriptors(s.a.get(), {}, {}).code(), absl::StatusCode::kInvalidArgument);
  // A message longer than the receiver takes is cut short: DATA_LOSS, and what came is closed.
  const size_t before = OpenDescriptors();
  const uint8_t long_message[100] = {};
  const int one[] = {s.a.get()};
  ASSERT_TRUE(SendWithDescriptors(s.a.get(), long_message, one).ok());
  auto cut = ReceiveWithDescriptors(s.b.get(), 10, MonotonicNow() + absl::Seconds(5));
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss) << cut.status();
  EXPECT_EQ(OpenDescriptors(), before);
  // The peer gone: UNAVAILABLE on both sides.
  s.a = OwnedFd();
  auto closed = ReceiveWithDescriptors(s.b.get(), 10, MonotonicNow() + absl::Seconds(5));
  EXPECT_EQ(closed.status().code(), absl::StatusCode::kUnavailable) << closed.status();
  EXPECT_EQ(SendWithDescriptors(s.b.get(), byte, {}).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace dlcp
