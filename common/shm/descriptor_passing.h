// Descriptors handed between processes of one host over a Unix SOCK_SEQPACKET socket (SCM_RIGHTS;
// each message arrives whole, with its descriptors), and
// who is at the socket's other end (SO_PEERCRED): how a host's processes give each other shared
// regions (shared_region.h), and how the side that hands them over
// checks whom it hands them to.
//
// Threading: free functions; one sender and one receiver per socket at a time.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace dlcp {

// A descriptor this object closes (move-only).
class OwnedFd {
 public:
  OwnedFd() = default;
  explicit OwnedFd(int fd) : fd_(fd) {}
  OwnedFd(OwnedFd&& other) noexcept : fd_(other.Release()) {}
  OwnedFd& operator=(OwnedFd&& other) noexcept;
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;
  ~OwnedFd();

  int get() const { return fd_; }
  // Gives the descriptor up (to an object that closes it, e.g. SharedRegion::Map).
  int Release();

 private:
  int fd_ = -1;
};

// The process at the other end of a connected Unix socket, as the kernel recorded it at connect().
struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};
absl::StatusOr<PeerCredentials> PeerOf(int unix_socket);

// The most descriptors one message carries.
inline constexpr size_t kMaxPassedDescriptors = 8;

// Sends `message` (at least one byte) with `fds` attached, whole or not at all: UNAVAILABLE when
// the peer is gone, INVALID_ARGUMENT for more than kMaxPassedDescriptors.
absl::Status SendWithDescriptors(int unix_socket, absl::Span<const uint8_t> message, absl::Span<const int> fds);

struct ReceivedMessage {
  std::vector<uint8_t> message;
  std::vector<OwnedFd> fds;
};
// Receives one message of at most `max_bytes` and its descriptors (close-on-exec), waiting until
// `deadline`: DEADLINE_EXCEEDED then, UNAVAILABLE when the peer closed, DATA_LOSS when the message
// or its descriptors were cut short (those that came are closed).
absl::StatusOr<ReceivedMessage> ReceiveWithDescriptors(int unix_socket, size_t max_bytes, absl::Time deadline);

}  // namespace dlcp
