#include "server/control/connection_limits.h"

#include <sys/socket.h>
#include <sys/stat.h>

#include <optional>

#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "common/transport/address.h"

namespace dlcp {
namespace {

// The peer's address; nullopt for what is not a connected IP socket.
std::optional<Address> PeerAddress(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return std::nullopt;
  if (ss.ss_family != AF_INET && ss.ss_family != AF_INET6) return std::nullopt;
  return Address::FromSockaddr(reinterpret_cast<const sockaddr*>(&ss));
}

}  // namespace

ConnectionLimiter::Verdict ConnectionLimiter::Admit(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Verdict::kAdmitted;
  const std::optional<Address> from = PeerAddress(fd);
  if (!from) return Verdict::kAdmitted;
  const std::string peer = from->HostString();
  std::lock_guard<std::mutex> lock(mu_);
  if (auto stale = by_fd_.find(fd); stale != by_fd_.end()) Forget(stale);  // the fd was closed and reused
  auto over = [&] {
    if (by_fd_.size() >= limits_.max_connections) return Verdict::kOverall;
    auto p = per_peer_.find(peer);
    if (p != per_peer_.end() && p->second >= limits_.max_per_peer) return Verdict::kPerPeer;
    return Verdict::kAdmitted;
  };
  Verdict v = over();
  // Counts only grow between sweeps, so a refusal is checked against fresh ones first; sweeps
  // are rationed, so a flood at the limit costs one pass over the table a tick, not one a connect.
  if (v != Verdict::kAdmitted && MonotonicNow() - last_sweep_ >= absl::Milliseconds(50)) {
    Sweep();
    v = over();
  }
  if (v != Verdict::kAdmitted) {
    (v == Verdict::kOverall ? refused_overall_ : refused_per_peer_).fetch_add(1, std::memory_order_relaxed);
    return v;
  }
  by_fd_[fd] = Held{st.st_ino, peer, from->port};
  ++per_peer_[peer];
  held_.store(by_fd_.size(), std::memory_order_relaxed);
  return v;
}

void ConnectionLimiter::Refresh() {
  std::lock_guard<std::mutex> lock(mu_);
  Sweep();
}

void ConnectionLimiter::CloseLater(const std::string& host, uint16_t port, absl::Time at) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [fd, held] : by_fd_) {
    if (held.port != port || held.peer != host) continue;
    // Marked once, however often it is refused before the mark falls due: the marks are bounded
    // by the connections held.
    for (const Closing& c : closing_) {
      if (c.fd == fd && c.inode == held.inode) return;
    }
    closing_.push_back(Closing{fd, held.inode, at});
    return;
  }
}

void ConnectionLimiter::CloseDue(absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(closing_, [&](const Closing& c) {
    if (c.at > now) return false;
    struct stat st {};
    // Still the socket accepted (not closed, its number not reused): gRPC sees it end and closes it.
    if (::fstat(c.fd, &st) == 0 && st.st_ino == c.inode && ::shutdown(c.fd, SHUT_RDWR) == 0) {
      closed_later_.fetch_add(1, std::memory_order_relaxed);
    }
    return true;
  });
}

void ConnectionLimiter::Sweep() {
  last_sweep_ = MonotonicNow();
  for (auto it = by_fd_.begin(); it != by_fd_.end();) {
    struct stat st {};
    const bool gone = ::fstat(it->first, &st) != 0 || st.st_ino != it->second.inode;
    auto next = std::next(it);
    if (gone) Forget(it);
    it = next;
  }
  held_.store(by_fd_.size(), std::memory_order_relaxed);
}

void ConnectionLimiter::Forget(std::map<int, Held>::iterator it) {
  auto p = per_peer_.find(it->second.peer);
  if (p != per_peer_.end() && --p->second == 0) per_peer_.erase(p);
  by_fd_.erase(it);
}

}  // namespace dlcp
