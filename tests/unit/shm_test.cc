// The shared-memory building blocks of the host stage: sealed regions, within a process and
// between processes, and the hand-over of their descriptors over a Unix socket, with the peer's
// credentials.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "common/shm/descriptor_passing.h"
#include "common/shm/shared_region.h"
#include "gtest/gtest.h"

namespace dlcp {
namespace {

uint64_t Value(const void* at) {
  uint64_t v = 0;
  std::memcpy(&v, at, sizeof(v));
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

// A region a child process maps from the descriptor (as a peer that received it would) shares
// the parent's bytes both ways.
TEST(SharedRegion, TwoProcessesShareItsBytes) {
  auto region = SharedRegion::Create("processes", 4096);
  ASSERT_TRUE(region.ok()) << region.status();
  auto* words = reinterpret_cast<std::atomic<uint64_t>*>(region->data());
  words[0].store(41);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto mapped = SharedRegion::Map(::dup(region->fd()), region->size());
    if (!mapped.ok()) ::_exit(2);
    auto* theirs = reinterpret_cast<std::atomic<uint64_t>*>(mapped->data());
    if (theirs[0].load() != 41) ::_exit(3);
    theirs[1].store(42);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(words[1].load(), 42u);
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

TEST(DescriptorPassing, ARegionPassedOverASocketIsTheSameMemoryOnTheOtherSide) {
  SocketPair s;
  auto region = SharedRegion::Create("passed", 4096);
  auto second = SharedRegion::Create("second", 8192);
  ASSERT_TRUE(region.ok() && second.ok());
  const uint8_t hello[] = {'s', 't', 'a', 'g'};
  const int fds[] = {region->fd(), second->fd()};
  ASSERT_TRUE(SendWithDescriptors(s.a.get(), hello, fds).ok());
  auto got = ReceiveWithDescriptors(s.b.get(), 64, MonotonicNow() + absl::Seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->message, std::vector<uint8_t>(hello, hello + 4));
  ASSERT_EQ(got->fds.size(), 2u);
  EXPECT_NE(got->fds[0].get(), region->fd());  // a new descriptor of the same memfd
  EXPECT_EQ(::fcntl(got->fds[0].get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  auto mapped = SharedRegion::Map(got->fds[0].Release(), region->size());
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  auto mapped_second = SharedRegion::Map(got->fds[1].Release(), second->size());
  ASSERT_TRUE(mapped_second.ok()) << mapped_second.status();
  const uint64_t v = 77;
  std::memcpy(region->data(), &v, sizeof(v));
  EXPECT_EQ(Value(mapped->data()), 77u);
  std::memcpy(static_cast<uint8_t*>(mapped_second->data()) + 4096, &v, sizeof(v));
  EXPECT_EQ(Value(static_cast<uint8_t*>(second->data()) + 4096), 77u);
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
