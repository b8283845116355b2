#include "common/transport/udp/udp_transport.h"

#include <netinet/ip.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/log.h"
#include "common/base/syscall.h"

namespace dlcp {
namespace {

constexpr size_t kSendBatch = 64;
constexpr size_t kTosCmsgSpace = CMSG_SPACE(sizeof(int));

int PollTimeoutMs(absl::Time deadline) {
  absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))), 1000));
}

class UdpTransport final : public Transport {
 public:
  explicit UdpTransport(const TransportOptions& options) : options_(options) {}

  ~UdpTransport() override {
    if (fd_ >= 0) ::close(fd_);
    if (wake_fd_ >= 0) ::close(wake_fd_);
    std::free(recv_pool_);
  }

  absl::Status Init() {
    fd_ = DLCP_SYSCALL(::socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    wake_fd_ = DLCP_SYSCALL(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    absl::StatusOr<Address> bind_addr = ResolveAddress(options_.bind_host, options_.port);
    if (!bind_addr.ok()) return bind_addr.status();
    SetBuffer(SO_RCVBUFFORCE, SO_RCVBUF, "receive");
    SetBuffer(SO_SNDBUFFORCE, SO_SNDBUF, "send");
    sockaddr_in sa = bind_addr->ToSockaddr();
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
      return ErrnoToStatus(errno, absl::StrCat("bind UDP ", bind_addr->ToString()));
    }
    socklen_t len = sizeof(sa);
    DLCP_SYSCALL(::getsockname(fd_, reinterpret_cast<sockaddr*>(&sa), &len));
    local_ = Address::FromSockaddr(sa);
    // A wildcard bind reports 0.0.0.0; peers on this host reach it through 127.0.0.1.
    if (local_.ipv4 == 0) local_.ipv4 = 0x7f000001;

    // Each receive slot holds one datagram; 64-byte alignment keeps payloads (after the 48-byte
    // header) 16-byte aligned for the SIMD reduction.
    slot_size_ = (options_.max_datagram + 63) & ~size_t{63};
    recv_pool_ = static_cast<uint8_t*>(std::aligned_alloc(64, slot_size_ * options_.recv_batch));
    if (recv_pool_ == nullptr) return absl::ResourceExhaustedError("UDP receive pool");
    recv_iov_.resize(options_.recv_batch);
    recv_hdr_.resize(options_.recv_batch);
    recv_from_.resize(options_.recv_batch);
    return absl::OkStatus();
  }

  Address local_address() const override { return local_; }
  size_t max_datagram() const override { return options_.max_datagram; }

  absl::Status Send(absl::Span<const OutMessage> messages, absl::Time deadline) override {
    mmsghdr hdrs[kSendBatch];
    iovec iovs[kSendBatch][2];
    sockaddr_in addrs[kSendBatch];
    alignas(cmsghdr) uint8_t cmsgs[kSendBatch][kTosCmsgSpace];
    size_t done = 0;
    while (done < messages.size()) {
      const size_t n = std::min(kSendBatch, messages.size() - done);
      for (size_t i = 0; i < n; ++i) {
        const OutMessage& m = messages[done + i];
        if (m.header_len + m.payload_len > options_.max_datagram) {
          return absl::InvalidArgumentError(absl::StrCat("datagram of ", m.header_len + m.payload_len,
                                                         " bytes exceeds max_datagram ", options_.max_datagram));
        }
        addrs[i] = m.to.ToSockaddr();
        iovs[i][0] = {const_cast<uint8_t*>(m.header), m.header_len};
        iovs[i][1] = {const_cast<uint8_t*>(m.payload), m.payload_len};
        msghdr& h = hdrs[i].msg_hdr;
        std::memset(&h, 0, sizeof(h));
        h.msg_name = &addrs[i];
        h.msg_namelen = sizeof(sockaddr_in);
        h.msg_iov = iovs[i];
        h.msg_iovlen = m.payload_len > 0 ? 2 : 1;
        h.msg_control = cmsgs[i];
        h.msg_controllen = kTosCmsgSpace;
        cmsghdr* c = CMSG_FIRSTHDR(&h);
        c->cmsg_level = IPPROTO_IP;
        c->cmsg_type = IP_TOS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        int tos = options_.dscp[m.priority & 3] << 2;
        std::memcpy(CMSG_DATA(c), &tos, sizeof(int));
      }
      size_t sent_in_batch = 0;
      while (sent_in_batch < n) {
        int rc = ::sendmmsg(fd_, hdrs + sent_in_batch, static_cast<unsigned>(n - sent_in_batch), MSG_DONTWAIT);
        if (rc > 0) {
          for (int i = 0; i < rc; ++i) {
            counters_.sent_bytes.fetch_add(hdrs[sent_in_batch + i].msg_len, std::memory_order_relaxed);
          }
          counters_.sent_packets.fetch_add(rc, std::memory_order_relaxed);
          sent_in_batch += rc;
          continue;
        }
        if (rc < 0 && errno == EINTR) continue;
        if (rc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS)) {
          counters_.send_would_block.fetch_add(1, std::memory_order_relaxed);
          if (absl::Now() >= deadline) return absl::DeadlineExceededError("UDP send: no buffer space before deadline");
          pollfd p{fd_, POLLOUT, 0};
          DLCP_RETRY_EINTR(::poll(&p, 1, std::max(1, PollTimeoutMs(deadline))));
          continue;
        }
        if (rc < 0 && (errno == ECONNREFUSED || errno == EHOSTUNREACH || errno == ENETUNREACH)) {
          // An ICMP error from an earlier datagram; that peer is gone, the protocol's repair and
          // deadlines handle it. Skip the message at the head and carry on.
          counters_.dropped.fetch_add(1, std::memory_order_relaxed);
          ++sent_in_batch;
          continue;
        }
        return ErrnoToStatus(errno, "sendmmsg");
      }
      done += n;
    }
    return absl::OkStatus();
  }

  absl::Status Receive(std::vector<InMessage>* out, absl::Duration timeout) override {
    out->clear();
    const absl::Time deadline = absl::Now() + timeout;
    for (;;) {
      absl::StatusOr<int> got = RecvBatch(out);
      if (!got.ok()) return got.status();
      if (*got > 0) return absl::OkStatus();
      if (woken_.exchange(false)) return absl::OkStatus();
      if (absl::Now() >= deadline) return absl::OkStatus();
      if (options_.busy_poll) continue;
      pollfd p[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      int rc = DLCP_RETRY_EINTR(::poll(p, 2, PollTimeoutMs(deadline)));
      if (rc < 0) return ErrnoToStatus(errno, "poll");
      if (p[1].revents & POLLIN) {
        uint64_t v;
        ssize_t unused = ::read(wake_fd_, &v, sizeof(v));
        (void)unused;
        woken_.store(false);
        if (!(p[0].revents & POLLIN)) return absl::OkStatus();
      }
      if (rc == 0) return absl::OkStatus();
    }
  }

  void Wake() override {
    woken_.store(true);
    uint64_t one = 1;
    ssize_t unused = ::write(wake_fd_, &one, sizeof(one));
    (void)unused;
  }

 private:
  void SetBuffer(int force_opt, int opt, const char* what) {
    int v = static_cast<int>(options_.socket_buffer_bytes);
    if (::setsockopt(fd_, SOL_SOCKET, force_opt, &v, sizeof(v)) == 0) return;
    // Without CAP_NET_ADMIN the kernel caps the size at net.core.{r,w}mem_max.
    ::setsockopt(fd_, SOL_SOCKET, opt, &v, sizeof(v));
    int actual = 0;
    socklen_t len = sizeof(actual);
    ::getsockopt(fd_, SOL_SOCKET, opt, &actual, &len);
    if (static_cast<size_t>(actual) < options_.socket_buffer_bytes) {
      DLCP_LOG(Warning) << "UDP " << what << " buffer is " << actual << " bytes, asked for "
                        << options_.socket_buffer_bytes << "; raise net.core." << (opt == SO_RCVBUF ? "r" : "w")
                        << "mem_max or run with CAP_NET_ADMIN to avoid drops under bursts";
    }
  }

  absl::StatusOr<int> RecvBatch(std::vector<InMessage>* out) {
    const size_t n = options_.recv_batch;
    for (size_t i = 0; i < n; ++i) {
      recv_iov_[i] = {recv_pool_ + i * slot_size_, options_.max_datagram};
      msghdr& h = recv_hdr_[i].msg_hdr;
      std::memset(&h, 0, sizeof(h));
      h.msg_name = &recv_from_[i];
      h.msg_namelen = sizeof(sockaddr_in);
      h.msg_iov = &recv_iov_[i];
      h.msg_iovlen = 1;
    }
    int rc = DLCP_RETRY_EINTR(::recvmmsg(fd_, recv_hdr_.data(), static_cast<unsigned>(n), MSG_DONTWAIT, nullptr));
    if (rc < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      return ErrnoToStatus(errno, "recvmmsg");
    }
    for (int i = 0; i < rc; ++i) {
      size_t len = recv_hdr_[i].msg_len;
      if (recv_hdr_[i].msg_hdr.msg_flags & MSG_TRUNC) {
        counters_.dropped.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      counters_.recv_bytes.fetch_add(len, std::memory_order_relaxed);
      out->push_back(InMessage{Address::FromSockaddr(recv_from_[i]), recv_pool_ + i * slot_size_, len});
    }
    counters_.recv_packets.fetch_add(rc, std::memory_order_relaxed);
    return rc;
  }

  TransportOptions options_;
  int fd_ = -1;
  int wake_fd_ = -1;
  std::atomic<bool> woken_{false};
  Address local_;
  size_t slot_size_ = 0;
  uint8_t* recv_pool_ = nullptr;
  std::vector<iovec> recv_iov_;
  std::vector<mmsghdr> recv_hdr_;
  std::vector<sockaddr_in> recv_from_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> CreateUdpTransport(const TransportOptions& options) {
  auto t = std::make_unique<UdpTransport>(options);
  if (absl::Status s = t->Init(); !s.ok()) return s;
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace dlcp
