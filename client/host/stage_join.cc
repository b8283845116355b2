#include "client/host/stage_join.h"

#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/shm/stage_layout.h"

namespace dlcp {
namespace {

absl::StatusOr<OwnedFd> Connect(const std::string& path) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("host_socket '", path, "' is not a usable socket path"));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  OwnedFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return absl::UnavailableError(absl::StrCat("socket(AF_UNIX): ", std::strerror(errno)));
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return absl::UnavailableError(
        absl::StrCat("no dlcpd serves host_socket ", path, " (", std::strerror(errno), ")"));
  }
  return fd;
}

// Checks the region against the welcome: what the members rely on comes from dlcpd's message.
absl::Status CheckRegion(const SharedRegion& region, const HostWelcome& w) {
  const auto* h = static_cast<const StageHeader*>(region.data());
  if (h->magic != kStageMagic || h->version != kStageVersion || h->members != w.ranks.size() ||
      h->slot_bytes != w.slot_bytes) {
    return absl::FailedPreconditionError("the host stage's region does not match dlcpd's answer");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OwnedFd> RequestHostStage(const StageJoinOptions& o) {
  absl::StatusOr<OwnedFd> fd = Connect(o.socket_path);
  if (!fd.ok()) return fd.status();
  if (absl::Status sent = SendWithDescriptors(fd->get(), EncodeHostHello(o.hello), {}); !sent.ok()) return sent;
  return fd;
}

absl::StatusOr<StageMembership> AwaitHostStage(OwnedFd& socket, const StageJoinOptions& o, absl::Time deadline) {
  absl::StatusOr<ReceivedMessage> answer = ReceiveWithDescriptors(socket.get(), kMaxHostMessageBytes, deadline);
  if (!answer.ok()) {
    if (!absl::IsDeadlineExceeded(answer.status())) socket = OwnedFd();
    return absl::Status(answer.status().code(), absl::StrCat("dlcpd at ", o.socket_path, ": ", answer.status().message()));
  }
  OwnedFd fd = std::move(socket);  // whatever the answer says, this request is answered
  absl::StatusOr<HostWelcome> welcome = DecodeHostWelcome(answer->message);
  if (!welcome.ok()) return welcome.status();
  if (welcome->code != absl::StatusCode::kOk) return absl::Status(welcome->code, welcome->reason);
  if (answer->fds.size() != 1) return absl::FailedPreconditionError("dlcpd's answer came without its region");
  const uint64_t bytes = StageRegionBytes(static_cast<uint32_t>(welcome->ranks.size()), welcome->slot_bytes);
  absl::StatusOr<SharedRegion> region = SharedRegion::Map(answer->fds[0].Release(), bytes);
  if (!region.ok()) return region.status();
  if (absl::Status ok = CheckRegion(*region, *welcome); !ok.ok()) return ok;
  if (welcome->ranks[welcome->member] != o.hello.rank) {
    return absl::FailedPreconditionError("dlcpd placed this worker under another rank");
  }
  return StageMembership{std::move(*region), std::move(*welcome), std::move(fd)};
}

absl::StatusOr<StageMembership> JoinHostStage(const StageJoinOptions& o) {
  absl::StatusOr<OwnedFd> fd = RequestHostStage(o);
  if (!fd.ok()) return fd.status();
  return AwaitHostStage(*fd, o, MonotonicNow() + o.timeout);
}

}  // namespace dlcp
