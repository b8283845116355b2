#include "common/transport/udp/udp_transport.h"

#include <netinet/ip.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "common/base/log.h"
#include "common/base/syscall.h"
#include "common/transport/doubling_report.h"
#include "common/transport/waker.h"
#include "common/transport/transport_options.h"

namespace dlcp {
namespace {

constexpr size_t kSendBatch = 64;
constexpr size_t kMaxGsoSegments = 64;    // the kernel's UDP_MAX_SEGMENTS
constexpr size_t kMaxGsoBytes = 65000;    // a GSO super-datagram must fit one IP datagram
constexpr size_t kCmsgSpace = CMSG_SPACE(sizeof(int)) + CMSG_SPACE(sizeof(uint16_t));  // IP_TOS + UDP_SEGMENT
// What a receive may carry: UDP_GRO's segment size and SO_RXQ_OVFL's drop count.
constexpr size_t kRecvCmsgSpace = CMSG_SPACE(sizeof(int)) + CMSG_SPACE(sizeof(uint32_t));

class UdpTransport final : public Transport {
 public:
  explicit UdpTransport(const TransportOptions& options) : options_(options) {}

  ~UdpTransport() override {
    if (fd_ >= 0) ::close(fd_);
    for (int fd : spray_fds_) ::close(fd);
    std::free(recv_pool_);
  }

  absl::Status Init() {
    absl::StatusOr<Address> bind_addr = ResolveAddress(options_.bind_host, options_.port);
    if (!bind_addr.ok()) return bind_addr.status();
    family_ = bind_addr->family();
    absl::StatusOr<int> fd = OpenSocket();
    if (!fd.ok()) return fd.status();
    fd_ = *fd;
    if (absl::Status s = waker_.Init(); !s.ok()) return s;
    SetBuffer(fd_, SO_RCVBUFFORCE, SO_RCVBUF, "receive");
    SetBuffer(fd_, SO_SNDBUFFORCE, SO_SNDBUF, "send");
    absl::StatusOr<Address> bound = Bind(fd_, *bind_addr);
    if (!bound.ok()) return bound.status();
    local_ = *bound;
    // A wildcard bind reports 0.0.0.0 or ::; peers on this host reach it through loopback.
    if (local_.wildcard() && local_.v6) {
      local_.ipv6[15] = 1;  // ::1
    } else if (local_.wildcard()) {
      local_.ipv4 = 0x7f000001;
    }
    send_fds_.push_back(fd_);
    for (uint32_t i = 1; i < options_.spray_ports; ++i) {
      // Send-only sockets on free ports of the same address. Nobody is told to send to them;
      // a minimal receive buffer bounds what strays could queue there.
      absl::StatusOr<int> spray = OpenSocket();
      if (!spray.ok()) return spray.status();
      spray_fds_.push_back(*spray);
      Address any = *bind_addr;
      any.port = 0;
      absl::StatusOr<Address> at = Bind(*spray, any);
      if (!at.ok()) return at.status();
      spray_ports_.push_back(at->port);
      SetBuffer(*spray, SO_SNDBUFFORCE, SO_SNDBUF, "send");
      int tiny = 1;
      ::setsockopt(*spray, SOL_SOCKET, SO_RCVBUF, &tiny, sizeof(tiny));
      send_fds_.push_back(*spray);
    }

    // Each receive slot holds one datagram; 64-byte alignment keeps payloads (after the 48-byte
    // header) 16-byte aligned for the SIMD reduction.
    slot_size_ = (std::max<size_t>(options_.max_datagram, options_.udp.gro ? 65535 : 0) + 63) & ~size_t{63};
    recv_pool_ = static_cast<uint8_t*>(std::aligned_alloc(64, slot_size_ * options_.recv_batch));
    if (recv_pool_ == nullptr) return absl::ResourceExhaustedError("UDP receive pool");
    int one = 1;
    if (options_.udp.gro) gro_ = ::setsockopt(fd_, SOL_UDP, UDP_GRO, &one, sizeof(one)) == 0;
    // The kernel's count of datagrams it dropped for a full receive buffer, on every receive: the
    // one loss on the path that happens on this host, and that a larger buffer cures.
    overflow_count_ = ::setsockopt(fd_, SOL_SOCKET, SO_RXQ_OVFL, &one, sizeof(one)) == 0;
    recv_cmsg_.resize(options_.recv_batch);
    recv_iov_.resize(options_.recv_batch);
    recv_hdr_.resize(options_.recv_batch);
    recv_from_.resize(options_.recv_batch);
    return absl::OkStatus();
  }

  Address local_address() const override { return local_; }
  TransportOptions::Kind kind() const override { return TransportOptions::Kind::kUdp; }
  std::vector<Address> spray_sources() const override {
    std::vector<Address> out;
    for (uint16_t p : spray_ports_) {
      Address a = local_;
      a.port = p;
      out.push_back(a);
    }
    return out;
  }
  size_t max_datagram() const override { return options_.max_datagram; }
  size_t send_paths() const override { return send_fds_.size(); }

  absl::Status Send(absl::Span<const OutMessage> messages, absl::Time deadline) override {
    for (const OutMessage& m : messages) {
      if (m.size() > options_.max_datagram) {
        return absl::InvalidArgumentError(absl::StrCat("datagram of ", m.size(),
                                                       " bytes exceeds max_datagram ", options_.max_datagram));
      }
      if (m.to.family() != family_) {
        return absl::InvalidArgumentError(absl::StrCat("cannot send to ", FamilyName(m.to.family()), " peer ",
                                                       m.to.ToString(), " from ", FamilyName(family_), " endpoint ",
                                                       local_.ToString(), ": every peer of a job must use one family"));
      }
    }
    size_t done = 0;
    while (done < messages.size()) {
      const size_t n = std::min(kSendBatch, messages.size() - done);
      absl::StatusOr<bool> sent = SendWindow(messages.subspan(done, n), deadline);
      if (!sent.ok()) return sent.status();
      if (!*sent) continue;  // GSO was refused and is now off: send the same window again
      done += n;
    }
    return absl::OkStatus();
  }

  absl::Status Receive(std::vector<InMessage>* out, absl::Duration timeout) override {
    out->clear();
    const absl::Time deadline = MonotonicNow() + timeout;
    for (;;) {
      absl::StatusOr<int> got = RecvBatch(out);
      if (!got.ok()) return got.status();
      if (*got > 0) return absl::OkStatus();
      if (waker_.TakeWoken()) return absl::OkStatus();
      if (MonotonicNow() >= deadline) return absl::OkStatus();
      if (options_.busy_poll) continue;
      absl::StatusOr<Waker::Result> w = waker_.Wait(fd_, deadline);
      if (!w.ok()) return w.status();
      if (!w->readable) return absl::OkStatus();  // woken, or the timeout passed
    }
  }

  void Wake() override { waker_.Wake(); }
  std::vector<std::pair<std::string_view, uint64_t>> OwnCounters() const override {
    return {{"gso_sends", gso_sends_.load(std::memory_order_relaxed)}};
  }

 private:
  absl::StatusOr<int> OpenSocket() {
    const int fd = DLCP_SYSCALL(::socket(family_, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    int one = 1;
    // An IPv6 endpoint serves IPv6 alone: its peers, and the addresses it tells them, are IPv6.
    if (family_ == AF_INET6 && ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one)) != 0) {
      const int err = errno;
      ::close(fd);
      return ErrnoToStatus(err, "setsockopt IPV6_V6ONLY");
    }
    return fd;
  }

  // Binds `fd` to `at` and returns the address it got (its port, where `at` asked for 0).
  static absl::StatusOr<Address> Bind(int fd, const Address& at) {
    SockAddr sa = at.ToSockaddr();
    if (::bind(fd, sa.get(), sa.len) != 0) return ErrnoToStatus(errno, absl::StrCat("bind UDP ", at.ToString()));
    sa.len = sizeof(sa.storage);
    DLCP_SYSCALL(::getsockname(fd, sa.get(), &sa.len));
    return Address::FromSockaddr(sa.get());
  }

  void SetBuffer(int fd, int force_opt, int opt, const char* what) {
    int v = static_cast<int>(options_.socket_buffer_bytes);
    // Without CAP_NET_ADMIN the forced size is refused, and the kernel caps the size at
    // net.core.{r,w}mem_max.
    if (::setsockopt(fd, SOL_SOCKET, force_opt, &v, sizeof(v)) != 0) ::setsockopt(fd, SOL_SOCKET, opt, &v, sizeof(v));
    int actual = 0;
    socklen_t len = sizeof(actual);
    ::getsockopt(fd, SOL_SOCKET, opt, &actual, &len);
    if (fd != fd_) return;
    if (opt == SO_RCVBUF) recv_buffer_bytes_ = static_cast<size_t>(actual);
    if (static_cast<size_t>(actual) < options_.socket_buffer_bytes) {
      DLCP_LOG(Warning) << "UDP " << what << " buffer is " << actual << " bytes, asked for "
                        << options_.socket_buffer_bytes << "; raise net.core." << (opt == SO_RCVBUF ? "r" : "w")
                        << "mem_max or run with CAP_NET_ADMIN to avoid drops under bursts";
    }
  }

  // What to do when a datagram is larger than the path takes: its size (one segment's, under
  // GSO) and the setting that decides it.
  static std::string MtuHint(const msghdr& h) {
    const size_t bytes = h.msg_iov[0].iov_len + (h.msg_iovlen > 1 ? h.msg_iov[1].iov_len : 0);
    return absl::StrCat(": datagrams of ", bytes, " bytes are larger than the path's MTU takes. Set chunk_bytes so ",
                        "that a chunk and its 48-byte header fit the MTU: 1400 for 1500, 8192 for 9000");
  }

  // One sendmmsg batch: each unit is a datagram, or a GSO super-datagram of `segments` of them,
  // leaving from socket `fd` (spray path `path`).
  struct SendBatch {
    mmsghdr hdrs[kSendBatch];
    iovec iovs[kSendBatch * 3];
    SockAddr addrs[kSendBatch];
    uint32_t segments[kSendBatch];
    int fd[kSendBatch];
    uint8_t path[kSendBatch];
    alignas(cmsghdr) uint8_t cmsgs[kSendBatch][kCmsgSpace];
    size_t units = 0;
    size_t iovs_used = 0;
  };

  // Sends up to kSendBatch messages. Consecutive messages to the same peer, class and length are
  // sent as one UDP GSO super-datagram (the kernel cuts it into datagrams), which saves a trip
  // through the stack per datagram. Returns false if the kernel refused GSO, which is then off.
  // When spraying, each burst of up to SprayBurstFor(size) datagrams leaves from the next source port,
  // unless its messages name a path (the port they leave from).
  absl::StatusOr<bool> SendWindow(absl::Span<const OutMessage> msgs, absl::Time deadline) {
    SendBatch batch;
    BuildUnits(msgs, &batch);
    return SendUnits(batch, deadline);
  }

  // Groups `msgs` into units, each with its port: a new burst takes the next spray port.
  void BuildUnits(absl::Span<const OutMessage> msgs, SendBatch* b) {
    const bool gso = options_.udp.gso && !gso_off_.load(std::memory_order_relaxed);
    const size_t ports = send_fds_.size();
    size_t port = ports > 1 ? next_port_.fetch_add(1, std::memory_order_relaxed) % ports : 0;
    size_t burst_used = 0;
    int last_fd = -1;
    for (size_t i = 0; i < msgs.size();) {
      const OutMessage& first = msgs[i];
      const size_t seg = first.size();
      const bool pinned = first.path >= 0 && ports > 1;
      const size_t burst = ports > 1 ? options_.SprayBurstFor(seg) : SIZE_MAX;
      if (!pinned && burst_used >= burst) {
        port = (port + 1) % ports;
        burst_used = 0;
      }
      const size_t unit_port = pinned ? static_cast<size_t>(first.path) % ports : port;
      const size_t room = pinned ? SIZE_MAX : burst - burst_used;
      const size_t count = gso ? GsoRun(msgs.subspan(i), room) : 1;
      AddUnit(msgs.subspan(i, count), seg, b);
      b->fd[b->units] = send_fds_[unit_port];
      b->path[b->units] = static_cast<uint8_t>(unit_port);
      if (ports > 1 && (pinned ? b->fd[b->units] != last_fd : burst_used == 0)) {
        counters_.spray_bursts.fetch_add(1, std::memory_order_relaxed);
      }
      last_fd = b->fd[b->units];
      if (!pinned) burst_used += count;
      b->segments[b->units++] = static_cast<uint32_t>(count);
      i += count;
    }
  }

  // How many of `msgs`, from the first, go as one GSO send: same peer, class, path and length (the
  // last may be shorter), within the kernel's limits and `room` datagrams of the burst.
  static size_t GsoRun(absl::Span<const OutMessage> msgs, size_t room) {
    const OutMessage& first = msgs[0];
    const size_t seg = first.size();
    size_t count = 1, total = seg;
    // Segments of a GSO send land back to back in the receiver's GRO buffer: only a size that
    // is a multiple of 4 keeps the float payloads after it aligned.
    while (seg % 4 == 0 && count < msgs.size() && count < kMaxGsoSegments && count < room) {
      const OutMessage& m = msgs[count];
      const size_t len = m.size();
      if (!(m.to == first.to) || m.priority != first.priority || m.path != first.path || len > seg ||
          total + len > kMaxGsoBytes) {
        break;
      }
      total += len;
      ++count;
      if (len < seg) break;  // only the last segment may be shorter
    }
    return count;
  }

  // The unit's header: its peer, its messages' buffers, its class's DSCP and, for more than one
  // message, the GSO segment size.
  void AddUnit(absl::Span<const OutMessage> msgs, size_t seg, SendBatch* b) {
    const OutMessage& first = msgs[0];
    const size_t u = b->units;
    msghdr& h = b->hdrs[u].msg_hdr;
    std::memset(&h, 0, sizeof(h));
    b->addrs[u] = first.to.ToSockaddr();
    h.msg_name = b->addrs[u].get();
    h.msg_namelen = b->addrs[u].len;
    h.msg_iov = &b->iovs[b->iovs_used];
    for (const OutMessage& m : msgs) {
      b->iovs[b->iovs_used++] = {const_cast<uint8_t*>(m.header), m.header_len};
      if (m.payload_len > 0) b->iovs[b->iovs_used++] = {const_cast<uint8_t*>(m.payload), m.payload_len};
      if (m.trailer_len > 0) b->iovs[b->iovs_used++] = {const_cast<uint8_t*>(m.trailer), m.trailer_len};
    }
    h.msg_iovlen = &b->iovs[b->iovs_used] - h.msg_iov;
    h.msg_control = b->cmsgs[u];
    h.msg_controllen = CMSG_SPACE(sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&h);
    c->cmsg_level = family_ == AF_INET6 ? IPPROTO_IPV6 : IPPROTO_IP;
    c->cmsg_type = family_ == AF_INET6 ? IPV6_TCLASS : IP_TOS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    int tos = options_.dscp[first.priority & 3] << 2;
    std::memcpy(CMSG_DATA(c), &tos, sizeof(int));
    if (msgs.size() > 1) {
      h.msg_controllen = kCmsgSpace;
      c = CMSG_NXTHDR(&h, c);
      c->cmsg_level = SOL_UDP;
      c->cmsg_type = UDP_SEGMENT;
      c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
      uint16_t gso_size = static_cast<uint16_t>(seg);
      std::memcpy(CMSG_DATA(c), &gso_size, sizeof(gso_size));
    }
  }

  // Hands the units to the kernel, those from one socket in one call. False: GSO was refused.
  absl::StatusOr<bool> SendUnits(SendBatch& b, absl::Time deadline) {
    size_t sent = 0;
    while (sent < b.units) {
      size_t run = 1;  // units that leave from the same socket go in one call
      while (sent + run < b.units && b.fd[sent + run] == b.fd[sent]) ++run;
      const int fd = b.fd[sent];
      int rc = ::sendmmsg(fd, b.hdrs + sent, static_cast<unsigned>(run), MSG_DONTWAIT);
      if (rc > 0) {
        for (int k = 0; k < rc; ++k) {
          counters_.sent_bytes.fetch_add(b.hdrs[sent + k].msg_len, std::memory_order_relaxed);
          counters_.sent_packets.fetch_add(b.segments[sent + k], std::memory_order_relaxed);
          counters_.path_packets[b.path[sent + k]].fetch_add(b.segments[sent + k], std::memory_order_relaxed);
          if (b.segments[sent + k] > 1) gso_sends_.fetch_add(1, std::memory_order_relaxed);
        }
        sent += rc;
        continue;
      }
      if (rc < 0 && errno == EINTR) continue;
      if (rc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS)) {
        counters_.send_would_block.fetch_add(1, std::memory_order_relaxed);
        if (MonotonicNow() >= deadline) return absl::DeadlineExceededError("UDP send: no buffer space before deadline");
        pollfd p{fd, POLLOUT, 0};
        DLCP_RETRY_EINTR(::poll(&p, 1, std::max(1, PollTimeoutMs(deadline))));
        continue;
      }
      if (rc == 0) return ErrnoToStatus(errno, "sendmmsg");
      absl::StatusOr<bool> skip = OnSendError(b, sent, errno);
      if (!skip.ok() || !*skip) return skip;
      counters_.dropped.fetch_add(b.segments[sent], std::memory_order_relaxed);
      ++sent;
    }
    return true;
  }

  // sendmmsg failed at unit `at` with `err`: true to skip that unit and carry on; false to send
  // again without GSO; or the error.
  absl::StatusOr<bool> OnSendError(const SendBatch& b, size_t at, int err) {
    if (b.segments[at] > 1 && (err == EINVAL || err == EIO || err == EOPNOTSUPP || err == EMSGSIZE)) {
      // The path cannot take GSO (e.g. segments larger than the device MTU: EMSGSIZE). Fall
      // back for good; what was sent already is resent, which the protocol tolerates
      // (duplicates are ignored). Single datagrams larger than the MTU are fragmented by IP.
      if (!gso_off_.exchange(true)) {
        DLCP_LOG(Warning) << "UDP GSO refused (" << std::strerror(err) << "); sending datagrams one by one"
                          << (err == EMSGSIZE ? MtuHint(b.hdrs[at].msg_hdr) : "");
      }
      return false;
    }
    // An ICMP error from an earlier datagram; that peer is gone, the protocol's repair and
    // deadlines handle it. Skip the unit at the head and carry on.
    if (err == ECONNREFUSED || err == EHOSTUNREACH || err == ENETUNREACH) return true;
    if (err == EMSGSIZE) {
      return absl::InvalidArgumentError(absl::StrCat("UDP send to ",
                                                     Address::FromSockaddr(b.addrs[at].get()).ToString(),
                                                     " refused (EMSGSIZE)", MtuHint(b.hdrs[at].msg_hdr)));
    }
    return ErrnoToStatus(err, "sendmmsg");
  }

  absl::StatusOr<int> RecvBatch(std::vector<InMessage>* out) {
    const size_t n = options_.recv_batch;
    for (size_t i = 0; i < n; ++i) {
      recv_iov_[i] = {recv_pool_ + i * slot_size_, slot_size_};
      msghdr& h = recv_hdr_[i].msg_hdr;
      std::memset(&h, 0, sizeof(h));
      h.msg_name = &recv_from_[i];
      h.msg_namelen = sizeof(sockaddr_storage);
      h.msg_iov = &recv_iov_[i];
      h.msg_iovlen = 1;
      if (gro_ || overflow_count_) {
        h.msg_control = recv_cmsg_[i].data();
        h.msg_controllen = kRecvCmsgSpace;
      }
    }
    int rc = DLCP_RETRY_EINTR(::recvmmsg(fd_, recv_hdr_.data(), static_cast<unsigned>(n), MSG_DONTWAIT, nullptr));
    if (rc < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      return ErrnoToStatus(errno, "recvmmsg");
    }
    int datagrams = 0;
    for (int i = 0; i < rc; ++i) {
      const msghdr& h = recv_hdr_[i].msg_hdr;
      const size_t len = recv_hdr_[i].msg_len;
      if (h.msg_flags & MSG_TRUNC) {
        counters_.dropped.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      counters_.recv_bytes.fetch_add(len, std::memory_order_relaxed);
      // With GRO, one buffer may hold several datagrams of `segment` bytes (the last shorter).
      size_t segment = len;
      if (h.msg_controllen > 0) {
        for (const cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr; c = CMSG_NXTHDR(const_cast<msghdr*>(&h), const_cast<cmsghdr*>(c))) {
          if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
            int v = 0;
            std::memcpy(&v, CMSG_DATA(c), sizeof(v));
            if (v > 0) segment = static_cast<size_t>(v);
          } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_RXQ_OVFL) {
            // The socket's running total when this datagram was queued (32 bits, wrapping).
            uint32_t total = 0;
            std::memcpy(&total, CMSG_DATA(c), sizeof(total));
            const uint32_t dropped = total - overflows_seen_;
            overflows_seen_ = total;
            if (dropped > 0) {
              ReportOverflows(counters_.rx_overflows.fetch_add(dropped, std::memory_order_relaxed) + dropped);
            }
          }
        }
      }
      const Address from = Address::FromSockaddr(reinterpret_cast<const sockaddr*>(&recv_from_[i]));
      const uint8_t* base = recv_pool_ + i * slot_size_;
      for (size_t off = 0; off < len; off += segment) {
        out->push_back(InMessage{from, base + off, std::min(segment, len - off)});
        ++datagrams;
      }
    }
    counters_.recv_packets.fetch_add(datagrams, std::memory_order_relaxed);
    return rc;
  }

  // Host loss is the operator's to fix, and nothing else names it: a warning at the first drop and
  // at each doubling of the count, so that a chronic overflow logs a few dozen lines in all.
  void ReportOverflows(uint64_t dropped) {
    if (!overflow_report_.Due(dropped)) return;
    DLCP_LOG(Warning) << "the kernel dropped " << dropped << " datagrams in all for UDP port " << local_.port
                      << ", its receive buffer (" << recv_buffer_bytes_ << " bytes) full; raise net.core.rmem_max (and the "
                      << "socket buffer setting) on this host, or read faster: this is loss on the host, not the "
                      << "network";
  }

  TransportOptions options_;
  int fd_ = -1;
  int family_ = AF_INET;  // the bound address's, AF_INET or AF_INET6
  std::vector<int> spray_fds_;        // owned; the sockets of the other source ports
  std::vector<int> send_fds_;         // fd_ first, then spray_fds_
  std::vector<uint16_t> spray_ports_;
  std::atomic<size_t> next_port_{0};  // where the next Send call starts its bursts
  Waker waker_;
  std::atomic<bool> gso_off_{false};
  std::atomic<uint64_t> gso_sends_{0};  // super-datagrams sent through GSO
  bool gro_ = false;
  bool overflow_count_ = false;
  uint32_t overflows_seen_ = 0;  // SO_RXQ_OVFL's total at the last receive that carried it
  DoublingReport overflow_report_;
  size_t recv_buffer_bytes_ = 0;       // fd_'s, as the kernel granted it
  std::vector<std::array<uint8_t, kRecvCmsgSpace>> recv_cmsg_;
  Address local_;
  size_t slot_size_ = 0;
  uint8_t* recv_pool_ = nullptr;
  std::vector<iovec> recv_iov_;
  std::vector<mmsghdr> recv_hdr_;
  std::vector<sockaddr_storage> recv_from_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> CreateUdpTransport(const TransportOptions& options) {
  auto t = std::make_unique<UdpTransport>(options);
  if (absl::Status s = t->Init(); !s.ok()) return s;
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace dlcp
