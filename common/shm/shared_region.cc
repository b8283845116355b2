#include "common/shm/shared_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/syscall.h"

namespace dlcp {
namespace {

constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

size_t RoundToPages(size_t bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

absl::StatusOr<void*> MapShared(int fd, size_t bytes) {
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) return ErrnoToStatus(errno, "mmap of a shared region");
  return data;
}

}  // namespace

absl::StatusOr<SharedRegion> SharedRegion::Create(const std::string& name, size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("a shared region needs at least one byte");
  const size_t size = RoundToPages(bytes);
  const int fd = DLCP_SYSCALL(::memfd_create(absl::StrCat("dlcp-", name).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  SharedRegion region(fd, nullptr, 0);  // closes the descriptor on every early return
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0 || ::fcntl(fd, F_ADD_SEALS, kSeals) != 0) {
    const int err = errno;
    return absl::ResourceExhaustedError(
        absl::StrCat("shared region '", name, "' of ", size, " bytes: ", ErrnoToStatus(err, "memfd").message()));
  }
  absl::StatusOr<void*> data = MapShared(fd, size);
  if (!data.ok()) return data.status();
  region.data_ = *data;
  region.size_ = size;
  return region;
}

absl::StatusOr<SharedRegion> SharedRegion::Map(int fd, size_t min_bytes) {
  SharedRegion region(fd, nullptr, 0);
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & kSeals) != kSeals) {
    return absl::FailedPreconditionError("the shared region's descriptor is not a sealed memfd");
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoToStatus(errno, "fstat of a shared region");
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < min_bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("the shared region holds ", size, " bytes, fewer than the ", min_bytes, " expected"));
  }
  absl::StatusOr<void*> data = MapShared(fd, size);
  if (!data.ok()) return data.status();
  region.data_ = *data;
  region.size_ = size;
  return region;
}

SharedRegion::SharedRegion(SharedRegion&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

SharedRegion& SharedRegion::operator=(SharedRegion&& other) noexcept {
  if (this != &other) {
    Release();
    fd_ = std::exchange(other.fd_, -1);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

SharedRegion::~SharedRegion() { Release(); }

void SharedRegion::Release() {
  if (data_ != nullptr) ::munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
  data_ = nullptr;
  fd_ = -1;
}

}  // namespace dlcp
