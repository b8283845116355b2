// A block of memory shared between processes of one host: an anonymous memfd, sealed at its size
// and mapped read-write. Its owner creates it and passes the descriptor to its peers (over a Unix
// socket, SCM_RIGHTS); a peer maps the descriptor it received. Nothing is in /dev/shm or any
// other file system, so only processes handed the descriptor reach it.
//
// Sealed against growing and shrinking (and against further seals being removed): no peer can
// truncate the file under the others, which would make their every access a SIGBUS. Map refuses
// a descriptor without those seals, so a peer cannot hand the owner such a file either.
//
// Threading: the object is not synchronized; what lives in the memory brings its own rules
// (stage_layout.h).
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace dlcp {

class SharedRegion {
 public:
  // A new region of `bytes` (rounded up to whole pages), zeroed. `name` shows in /proc/PID/fd
  // and maps ("memfd:dlcp-<name>"). RESOURCE_EXHAUSTED when the kernel refuses the memory.
  static absl::StatusOr<SharedRegion> Create(const std::string& name, size_t bytes);
  // Maps a descriptor a peer passed, taking ownership of it. FAILED_PRECONDITION when it is not a
  // sealed memfd of at least `min_bytes`.
  static absl::StatusOr<SharedRegion> Map(int fd, size_t min_bytes);

  SharedRegion(SharedRegion&& other) noexcept;
  SharedRegion& operator=(SharedRegion&& other) noexcept;
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  ~SharedRegion();

  void* data() const { return data_; }
  size_t size() const { return size_; }
  // The descriptor, to pass to a peer; it stays this object's.
  int fd() const { return fd_; }

 private:
  SharedRegion(int fd, void* data, size_t size) : fd_(fd), data_(data), size_(size) {}
  void Release();

  int fd_ = -1;
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace dlcp
