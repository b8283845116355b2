#include "common/transport/rdma/rdma_transport.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "common/base/log.h"
#include "common/base/syscall.h"
#include "common/transport/rdma/grh.h"
#include "common/transport/rdma/port_counters.h"
#include "common/transport/rdma/rdma_device.h"
#include "common/transport/rdma/verbs_loader.h"
#include "common/transport/doubling_report.h"
#include "common/transport/waker.h"
#include "common/transport/transport_options.h"

namespace dlcp {
namespace {

using rdma::kGrhBytes;

constexpr size_t kPage = 4096;
constexpr size_t kPostBatch = 32;  // work requests per ibv_post_send / ibv_post_srq_recv
// A receive buffer's datagram starts 64 bytes in (the GRH sits just before it), so payloads
// after the 48-byte dlcp header are 16-byte aligned for the SIMD reduction, as with UDP.
constexpr size_t kRecvDataOffset = 64;
constexpr const char* kSysfs = "/sys";  // where the kernel exports the port's counters

std::string MemlockAdvice(size_t bytes, int err) {
  rlimit r{};
  getrlimit(RLIMIT_MEMLOCK, &r);
  std::string limit = r.rlim_cur == RLIM_INFINITY ? "unlimited" : absl::StrCat(r.rlim_cur / 1024, " KiB");
  return absl::StrCat("cannot register ", bytes / 1024, " KiB of buffers with the RDMA device (", std::strerror(err),
                      "); the locked-memory limit is ", limit,
                      ": raise it (ulimit -l unlimited; systemd LimitMEMLOCK=infinity; in Kubernetes the IPC_LOCK "
                      "capability), or lower --rdma-recv-slots");
}

class RdmaTransport final : public Transport, public PortCounterSource {
 public:
  RdmaTransport(const rdma::Verbs& verbs, const TransportOptions& options) : v_(verbs), options_(options) {}

  ~RdmaTransport() override {
    for (auto& [key, ah] : ahs_) v_.destroy_ah(ah);
    for (ibv_qp* qp : qps_) v_.destroy_qp(qp);
    if (recv_.srq != nullptr) v_.destroy_srq(recv_.srq);
    if (recv_.cq != nullptr) v_.destroy_cq(recv_.cq);
    if (send_.cq != nullptr) v_.destroy_cq(send_.cq);
    if (recv_.channel != nullptr) v_.destroy_comp_channel(recv_.channel);
    if (send_.channel != nullptr) v_.destroy_comp_channel(send_.channel);
    if (recv_.mr != nullptr) v_.dereg_mr(recv_.mr);
    if (send_.mr != nullptr) v_.dereg_mr(send_.mr);
    if (pd_ != nullptr) v_.dealloc_pd(pd_);
    if (dev_.context != nullptr) v_.close_device(dev_.context);
    std::free(recv_.pool);
    std::free(send_.pool);
  }

  absl::Status Init() {
    if (absl::Status s = CheckSlots(options_.rdma); !s.ok()) return s;
    absl::StatusOr<uint32_t> want_ipv4 = BindIpv4();
    if (!want_ipv4.ok()) return want_ipv4.status();
    absl::StatusOr<rdma::DevicePort> dev = rdma::OpenDevicePort(v_, options_.rdma, *want_ipv4);
    if (!dev.ok()) return dev.status();
    dev_ = *dev;
    max_datagram_ = std::min(options_.max_datagram, dev_.mtu);
    if (absl::Status s = waker_.Init(); !s.ok()) return s;
    if (absl::Status s = CreateQueues(); !s.ok()) return s;
    if (absl::Status s = RegisterPools(); !s.ok()) return s;
    if (absl::Status s = CreateQueuePairs(); !s.ok()) return s;
    if (absl::Status s = StartReceiving(); !s.ok()) return s;
    local_ = Address{dev_.ipv4, 0, qps_[0]->qp_num};
    DLCP_LOG(Info) << "RDMA endpoint " << local_.ToString() << " on " << dev_.name << " port "
                   << static_cast<int>(dev_.port_num) << " GID index " << dev_.gid_index << ", MTU " << dev_.mtu
                   << ", " << recv_.slots << " receive and " << send_.slots << " send buffers, inline up to "
                   << max_inline_ << ", " << qps_.size() << " queue pair(s) for path spraying";
    return absl::OkStatus();
  }

  static absl::Status CheckSlots(const RdmaOptions& ro) {
    if (ro.qkey & 0x80000000u) {
      return absl::InvalidArgumentError(absl::StrCat("RDMA Q_Key 0x", absl::Hex(ro.qkey), " has the top bit set (privileged)"));
    }
    if (ro.signal_every == 0 || ro.send_slots % ro.signal_every != 0 || ro.recv_slots < 2 * kPostBatch) {
      return absl::InvalidArgumentError(absl::StrCat("RDMA slots: signal_every must divide send_slots (",
                                                     ro.send_slots, "/", ro.signal_every, ") and recv_slots be at least ",
                                                     2 * kPostBatch));
    }
    return absl::OkStatus();
  }

  // The IPv4 address whose GID the endpoint must use: bind_host's; 0 for a wildcard (any).
  absl::StatusOr<uint32_t> BindIpv4() const {
    if (options_.bind_host == "0.0.0.0" || options_.bind_host == "::" || options_.bind_host.empty()) return 0;
    absl::StatusOr<Address> a = ResolveAddress(options_.bind_host, 0);
    if (!a.ok()) return a.status();
    if (a->v6) {  // a RoCEv2 peer is addressed by its GID's IPv4 address (grh.h)
      return absl::InvalidArgumentError(
          absl::StrCat("RDMA reaches its peers at IPv4 addresses (RoCEv2 GIDs), and '", options_.bind_host, "' is IPv6"));
    }
    return a->ipv4;
  }

  // The protection domain, the completion channels (non-blocking) and queues, sized to the device.
  absl::Status CreateQueues() {
    const RdmaOptions& ro = options_.rdma;
    pd_ = v_.alloc_pd(dev_.context);
    if (pd_ == nullptr) return absl::InternalError(absl::StrCat("ibv_alloc_pd on ", dev_.name));
    recv_.channel = v_.create_comp_channel(dev_.context);
    send_.channel = v_.create_comp_channel(dev_.context);
    if (recv_.channel == nullptr || send_.channel == nullptr) return absl::InternalError("ibv_create_comp_channel");
    for (ibv_comp_channel* ch : {recv_.channel, send_.channel}) {
      int flags = DLCP_SYSCALL(::fcntl(ch->fd, F_GETFL));
      DLCP_SYSCALL(::fcntl(ch->fd, F_SETFL, flags | O_NONBLOCK));
    }
    recv_.slots = std::min<uint32_t>(ro.recv_slots, static_cast<uint32_t>(dev_.attr.max_srq_wr));
    send_.slots = std::min<uint32_t>(ro.send_slots, static_cast<uint32_t>(dev_.attr.max_qp_wr));
    send_.slots -= send_.slots % ro.signal_every;
    if (dev_.attr.max_srq == 0 || recv_.slots < 2 * kPostBatch || send_.slots == 0) {
      return absl::FailedPreconditionError(absl::StrCat(dev_.name, " lacks shared receive queues or queue depth"));
    }
    recv_.cq = v_.create_cq(dev_.context, static_cast<int>(recv_.slots), nullptr, recv_.channel, 0);
    send_.cq = v_.create_cq(dev_.context, static_cast<int>(send_.slots), nullptr, send_.channel, 0);
    if (recv_.cq == nullptr || send_.cq == nullptr) return absl::InternalError(absl::StrCat("ibv_create_cq on ", dev_.name));
    return absl::OkStatus();
  }

  // The shared receive queue, and one UD queue pair per spray port, each ready to send.
  absl::Status CreateQueuePairs() {
    ibv_srq_init_attr sa{};
    sa.attr.max_wr = recv_.slots;
    sa.attr.max_sge = 1;
    recv_.srq = v_.create_srq(pd_, &sa);
    if (recv_.srq == nullptr) return absl::InternalError(absl::StrCat("ibv_create_srq on ", dev_.name, " (errno ", errno, ")"));
    ibv_qp_init_attr qa{};
    qa.send_cq = send_.cq;
    qa.recv_cq = recv_.cq;
    qa.srq = recv_.srq;
    qa.qp_type = IBV_QPT_UD;
    qa.sq_sig_all = 0;
    qa.cap.max_send_wr = send_.slots;
    qa.cap.max_send_sge = 1;
    qa.cap.max_inline_data = 128;
    // Path spraying: one queue pair per "port". The NIC derives each RoCEv2 packet's UDP source
    // port from its queue pair, so bursts rotating over them spread over ECMP paths. They share
    // the CQs, the SRQ and the send ring; peers send only to the first.
    for (uint32_t i = 0; i < options_.spray_ports; ++i) {
      ibv_qp* qp = v_.create_qp(pd_, &qa);
      if (qp == nullptr && i == 0) {
        qa.cap.max_inline_data = 0;  // some devices have no inline sends for UD
        qp = v_.create_qp(pd_, &qa);
      }
      if (qp == nullptr) {
        return absl::InternalError(absl::StrCat("ibv_create_qp (UD) ", i + 1, " of ", options_.spray_ports, " on ",
                                                dev_.name, " (errno ", errno, ")"));
      }
      qps_.push_back(qp);
      if (absl::Status s = ToReadyToSend(qp); !s.ok()) return s;
    }
    max_inline_ = qa.cap.max_inline_data;
    send_.slot_qp.assign(send_.slots, 0);
    send_.completed_upto.assign(qps_.size(), 0);
    return absl::OkStatus();
  }

  // Posts every receive buffer, and reads the device's asynchronous events without blocking.
  absl::Status StartReceiving() {
    std::vector<uint32_t> all(recv_.slots);
    for (uint32_t i = 0; i < recv_.slots; ++i) all[i] = i;
    if (absl::Status s = PostReceives(all); !s.ok()) return s;
    recv_.wc.resize(options_.recv_batch);
    const int event_flags = DLCP_SYSCALL(::fcntl(dev_.context->async_fd, F_GETFL));
    DLCP_SYSCALL(::fcntl(dev_.context->async_fd, F_SETFL, event_flags | O_NONBLOCK));
    ArmQueueLimit();
    return absl::OkStatus();
  }

  Address local_address() const override { return local_; }
  size_t max_datagram() const override { return max_datagram_; }
  // A message may name its queue pair (OutMessage::path), as a UDP one names its source port.
  size_t send_paths() const override { return qps_.size(); }
  const PortCounterSource* port_counters() const override { return this; }
  std::map<std::string, std::string> where() const override {
    return {{"device", dev_.name}, {"port", absl::StrCat(dev_.port_num)}, {"gid_index", absl::StrCat(dev_.gid_index)}};
  }
  absl::StatusOr<std::vector<PortCounter>> ReadAll() const override {
    return ReadPortCounters(kSysfs, dev_.name, dev_.port_num);
  }
  absl::StatusOr<uint64_t> Read(const std::string& name) const override {
    return ReadPortCounter(kSysfs, dev_.name, dev_.port_num, name);
  }
  TransportOptions::Kind kind() const override { return TransportOptions::Kind::kRdma; }
  std::vector<Address> spray_sources() const override {
    std::vector<Address> out;
    for (size_t i = 1; i < qps_.size(); ++i) out.push_back(Address{dev_.ipv4, 0, qps_[i]->qp_num});
    return out;
  }

  absl::Status Send(absl::Span<const OutMessage> messages, absl::Time deadline) override {
    for (const OutMessage& m : messages) {
      if (m.size() > max_datagram_) {
        return absl::InvalidArgumentError(absl::StrCat("datagram of ", m.size(), " bytes exceeds the RDMA MTU ",
                                                       max_datagram_));
      }
    }
    std::lock_guard<std::mutex> lock(send_mu_);
    const bool spraying = qps_.size() > 1;
    size_t done = 0;
    while (done < messages.size()) {
      // One list per queue pair: while spraying, the rest of the current burst, or the run of
      // messages that name the same queue pair (path steering chooses it per message).
      const int16_t named = spraying ? messages[done].path : -1;
      const size_t burst = options_.SprayBurstFor(messages[done].size());
      if (named < 0 && spraying && send_.burst_used >= burst) {  // the burst is full: the next queue pair's turn
        send_.burst_used = 0;
        send_.qp_index = (send_.qp_index + 1) % qps_.size();
      }
      const size_t room = spraying && named < 0 ? burst - send_.burst_used : kPostBatch;
      const size_t limit = std::min({kPostBatch, messages.size() - done, room});
      size_t n = 1;
      while (n < limit && (!spraying || messages[done + n].path == named)) ++n;
      const size_t qp = named >= 0 ? static_cast<size_t>(named) % qps_.size() : send_.qp_index;
      if (absl::Status s = WaitForSendSlots(n, deadline); !s.ok()) return s;
      if (named >= 0 ? qp != send_.last_qp : spraying && send_.burst_used == 0) {
        counters_.spray_bursts.fetch_add(1, std::memory_order_relaxed);
      }
      send_.last_qp = qp;
      ibv_send_wr wrs[kPostBatch];
      ibv_sge sges[kPostBatch];
      for (size_t i = 0; i < n; ++i) {
        const OutMessage& m = messages[done + i];
        absl::StatusOr<ibv_ah*> ah = AddressHandle(m.to, m.priority);
        if (!ah.ok()) return ah.status();
        const uint64_t seq = send_.posted++;
        send_.slot_qp[seq % send_.slots] = static_cast<uint16_t>(qp);
        uint8_t* slot = send_.pool + (seq % send_.slots) * send_.slot_size;
        uint8_t* p = slot;
        if (m.header_len) p = static_cast<uint8_t*>(std::memcpy(p, m.header, m.header_len)) + m.header_len;
        if (m.payload_len) p = static_cast<uint8_t*>(std::memcpy(p, m.payload, m.payload_len)) + m.payload_len;
        if (m.trailer_len) std::memcpy(p, m.trailer, m.trailer_len);
        sges[i] = ibv_sge{reinterpret_cast<uint64_t>(slot), static_cast<uint32_t>(m.size()), send_.mr->lkey};
        ibv_send_wr& w = wrs[i];
        w = ibv_send_wr{};
        w.wr_id = seq;
        w.sg_list = &sges[i];
        w.num_sge = 1;
        w.opcode = IBV_WR_SEND;
        // A completion frees every earlier slot of its queue pair (a UD queue pair completes in
        // order): one per signal_every sends, and while spraying the last of each list too, so
        // every queue pair's sends are covered before it goes quiet.
        if (seq % options_.rdma.signal_every == options_.rdma.signal_every - 1 || (spraying && i + 1 == n)) {
          w.send_flags |= IBV_SEND_SIGNALED;
        }
        if (m.size() <= max_inline_) w.send_flags |= IBV_SEND_INLINE;
        w.wr.ud.ah = *ah;
        w.wr.ud.remote_qpn = m.to.qpn;
        w.wr.ud.remote_qkey = options_.rdma.qkey;
        w.next = i + 1 < n ? &wrs[i + 1] : nullptr;
      }
      ibv_send_wr* bad = nullptr;
      if (int rc = ibv_post_send(qps_[qp], wrs, &bad); rc != 0) {
        send_.posted = bad->wr_id;  // those before `bad` went out and hold their slots
        return ErrnoToStatus(rc, absl::StrCat("ibv_post_send on ", dev_.name));
      }
      if (named < 0 && spraying) send_.burst_used += n;
      counters_.path_packets[qp].fetch_add(n, std::memory_order_relaxed);
      for (size_t i = 0; i < n; ++i) {
        counters_.sent_packets.fetch_add(1, std::memory_order_relaxed);
        counters_.sent_bytes.fetch_add(messages[done + i].size(), std::memory_order_relaxed);
      }
      done += n;
    }
    return absl::OkStatus();
  }

  absl::Status Receive(std::vector<InMessage>* out, absl::Duration timeout) override {
    out->clear();
    // The buffers handed out by the previous call are the caller's no longer.
    if (!recv_.returned.empty()) {
      if (absl::Status s = PostReceives(recv_.returned); !s.ok()) return s;
      recv_.returned.clear();
      if (rearm_limit_) ArmQueueLimit();  // with buffers posted again, or it would fire at once
    }
    const absl::Time now = MonotonicNow();
    const absl::Time deadline = now + timeout;
    if (now >= next_event_check_) {
      next_event_check_ = now + kEventCheckInterval;
      TakeAsyncEvents();
    }
    for (;;) {
      absl::StatusOr<int> got = PollReceives(out);
      if (!got.ok()) return got.status();
      if (*got > 0) return absl::OkStatus();
      if (waker_.TakeWoken()) return absl::OkStatus();
      if (MonotonicNow() >= deadline) return absl::OkStatus();
      if (options_.busy_poll) continue;
      // Arm, then look once more, so a completion between the poll and the arm is not missed.
      if (int rc = ibv_req_notify_cq(recv_.cq, 0); rc != 0) return ErrnoToStatus(rc, "ibv_req_notify_cq");
      got = PollReceives(out);
      if (!got.ok()) return got.status();
      if (*got > 0) return absl::OkStatus();
      absl::StatusOr<Waker::Result> w = waker_.Wait(recv_.channel->fd, deadline);
      if (!w.ok()) return w.status();
      if (!w->readable) return absl::OkStatus();  // woken, or the timeout passed
      DrainEvent(recv_.channel);
    }
  }

  void Wake() override { waker_.Wake(); }
  std::vector<std::pair<std::string_view, uint64_t>> OwnCounters() const override {
    return {{"rx_queue_empty", rx_queue_empty_.load(std::memory_order_relaxed)}};
  }

 private:
  absl::Status RegisterPools() {
    recv_.slot_size = (kRecvDataOffset + dev_.mtu + 63) & ~size_t{63};
    send_.slot_size = (dev_.mtu + 63) & ~size_t{63};
    const size_t recv_bytes = (recv_.slot_size * recv_.slots + kPage - 1) & ~(kPage - 1);
    const size_t send_bytes = (send_.slot_size * send_.slots + kPage - 1) & ~(kPage - 1);
    recv_.pool = static_cast<uint8_t*>(std::aligned_alloc(kPage, recv_bytes));
    send_.pool = static_cast<uint8_t*>(std::aligned_alloc(kPage, send_bytes));
    if (recv_.pool == nullptr || send_.pool == nullptr) return absl::ResourceExhaustedError("RDMA buffer pools");
    recv_.mr = v_.reg_mr(pd_, recv_.pool, recv_bytes, IBV_ACCESS_LOCAL_WRITE);
    if (recv_.mr == nullptr) return absl::ResourceExhaustedError(MemlockAdvice(recv_bytes + send_bytes, errno));
    send_.mr = v_.reg_mr(pd_, send_.pool, send_bytes, 0);
    if (send_.mr == nullptr) return absl::ResourceExhaustedError(MemlockAdvice(recv_bytes + send_bytes, errno));
    return absl::OkStatus();
  }

  absl::Status ToReadyToSend(ibv_qp* qp) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = dev_.port_num;
    a.qkey = options_.rdma.qkey;
    if (int rc = v_.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY); rc != 0) {
      return ErrnoToStatus(rc, "ibv_modify_qp to INIT");
    }
    a = ibv_qp_attr{};
    a.qp_state = IBV_QPS_RTR;
    if (int rc = v_.modify_qp(qp, &a, IBV_QP_STATE); rc != 0) return ErrnoToStatus(rc, "ibv_modify_qp to RTR");
    a = ibv_qp_attr{};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0;
    if (int rc = v_.modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN); rc != 0) {
      return ErrnoToStatus(rc, "ibv_modify_qp to RTS");
    }
    return absl::OkStatus();
  }

  absl::Status PostReceives(absl::Span<const uint32_t> slots) {
    ibv_recv_wr wrs[kPostBatch];
    ibv_sge sges[kPostBatch];
    for (size_t done = 0; done < slots.size();) {
      const size_t n = std::min(kPostBatch, slots.size() - done);
      for (size_t i = 0; i < n; ++i) {
        const uint32_t slot = slots[done + i];
        uint8_t* buf = recv_.pool + slot * recv_.slot_size + kRecvDataOffset - kGrhBytes;
        sges[i] = ibv_sge{reinterpret_cast<uint64_t>(buf), static_cast<uint32_t>(kGrhBytes + dev_.mtu), recv_.mr->lkey};
        wrs[i] = ibv_recv_wr{};
        wrs[i].wr_id = slot;
        wrs[i].sg_list = &sges[i];
        wrs[i].num_sge = 1;
        wrs[i].next = i + 1 < n ? &wrs[i + 1] : nullptr;
      }
      ibv_recv_wr* bad = nullptr;
      if (int rc = ibv_post_srq_recv(recv_.srq, wrs, &bad); rc != 0) return ErrnoToStatus(rc, "ibv_post_srq_recv");
      done += n;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<int> PollReceives(std::vector<InMessage>* out) {
    const int n = ibv_poll_cq(recv_.cq, static_cast<int>(recv_.wc.size()), recv_.wc.data());
    if (n < 0) return absl::InternalError(absl::StrCat("ibv_poll_cq on ", dev_.name, " failed"));
    int delivered = 0;
    for (int i = 0; i < n; ++i) {
      const ibv_wc& wc = recv_.wc[i];
      const uint32_t slot = static_cast<uint32_t>(wc.wr_id);
      recv_.returned.push_back(slot);
      if (wc.status != IBV_WC_SUCCESS || wc.byte_len < kGrhBytes) {
        if (counters_.dropped.fetch_add(1, std::memory_order_relaxed) == 0) {
          DLCP_LOG(Warning) << "RDMA receive on " << dev_.name << " failed: " << v_.wc_status_str(wc.status) << ", "
                            << wc.byte_len << " bytes (further drops are only counted)";
        }
        continue;
      }
      const uint8_t* data = recv_.pool + slot * recv_.slot_size + kRecvDataOffset;
      std::optional<rdma::GrhSource> src = rdma::ParseGrh(data - kGrhBytes);
      if (!src) {  // a peer outside dlcp's IPv4-addressed RoCEv2
        if (counters_.dropped.fetch_add(1, std::memory_order_relaxed) == 0) {
          DLCP_LOG(Warning) << "RDMA datagram on " << dev_.name << " from qp " << wc.src_qp
                            << " has no IPv4 source in its GRH (GRH starts " << absl::BytesToHexString(absl::string_view(
                                   reinterpret_cast<const char*>(data - kGrhBytes), kGrhBytes))
                            << "); further drops are only counted";
        }
        continue;
      }
      const size_t len = wc.byte_len - kGrhBytes;
      out->push_back(InMessage{Address{src->ipv4, 0, wc.src_qp}, data, len, src->dscp});
      counters_.recv_packets.fetch_add(1, std::memory_order_relaxed);
      counters_.recv_bytes.fetch_add(len, std::memory_order_relaxed);
      ++delivered;
    }
    // All were errors: hand the buffers back now rather than wait for the next call.
    if (n > 0 && delivered == 0) {
      if (absl::Status s = PostReceives(recv_.returned); !s.ok()) return s;
      recv_.returned.clear();
      return 0;
    }
    return delivered;
  }

  // Reaps send completions until `n` slots are free, blocking on the send channel by deadline.
  absl::Status WaitForSendSlots(size_t n, absl::Time deadline) {
    bool counted = false, armed = false;
    for (;;) {
      ibv_wc wc[16];
      const int got = ibv_poll_cq(send_.cq, 16, wc);
      if (got < 0) return absl::InternalError("ibv_poll_cq (send)");
      for (int i = 0; i < got; ++i) {
        if (wc[i].status != IBV_WC_SUCCESS) {
          DLCP_LOG(Warning) << "RDMA send on " << dev_.name << " failed: " << v_.wc_status_str(wc[i].status);
        }
        for (size_t q = 0; q < qps_.size(); ++q) {
          if (qps_[q]->qp_num == wc[i].qp_num) send_.completed_upto[q] = std::max(send_.completed_upto[q], wc[i].wr_id + 1);
        }
      }
      // Slots free up in ring order, as far as every queue pair's completions reach.
      while (send_.completed < send_.posted && send_.completed_upto[send_.slot_qp[send_.completed % send_.slots]] > send_.completed) ++send_.completed;
      if (send_.posted - send_.completed + n <= send_.slots) return absl::OkStatus();
      if (!counted) {
        counters_.send_would_block.fetch_add(1, std::memory_order_relaxed);
        counted = true;
      }
      if (MonotonicNow() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat("no RDMA send buffer freed on ", dev_.name, " by the deadline"));
      }
      if (options_.busy_poll || got > 0) {
        armed = false;
        continue;
      }
      if (!armed) {
        // Arm, then look once more, so a completion between the poll and the arm is not missed.
        if (int rc = ibv_req_notify_cq(send_.cq, 0); rc != 0) return ErrnoToStatus(rc, "ibv_req_notify_cq (send)");
        armed = true;
        continue;
      }
      pollfd p{send_.channel->fd, POLLIN, 0};
      if (DLCP_RETRY_EINTR(::poll(&p, 1, std::max(1, PollTimeoutMs(deadline)))) > 0) DrainEvent(send_.channel);
      armed = false;
    }
  }

  // The shared receive queue's limit event, armed at one posted buffer, fires when a datagram
  // takes the last one: what arrives after it, until the I/O thread posts buffers again, is
  // dropped by the NIC, uncounted (an RDMA UD queue has no receiver-not-ready handshake). The
  // event is the one place it shows. Armed again once buffers are posted again (Receive).
  void ArmQueueLimit() {
    rearm_limit_ = false;
    ibv_srq_attr a{};
    a.srq_limit = 1;
    if (int rc = v_.modify_srq(recv_.srq, &a, IBV_SRQ_LIMIT); rc != 0 && !limit_unsupported_) {
      limit_unsupported_ = true;
      DLCP_LOG(Info) << dev_.name << " cannot arm its receive queue's limit event (" << std::strerror(rc)
                     << "): a receive queue that runs dry will not be reported";
    }
  }

  static bool IsFault(ibv_event_type type) {
    switch (type) {
      case IBV_EVENT_PORT_ACTIVE:
      case IBV_EVENT_LID_CHANGE:
      case IBV_EVENT_PKEY_CHANGE:
      case IBV_EVENT_SM_CHANGE:
      case IBV_EVENT_CLIENT_REREGISTER:
      case IBV_EVENT_GID_CHANGE:
        return false;
      default:
        return true;
    }
  }

  // Reads what the device reported since the last call; never blocks.
  void TakeAsyncEvents() {
    ibv_async_event e{};
    while (v_.get_async_event(dev_.context, &e) == 0) {
      const ibv_event_type type = e.event_type;
      const bool ours = type == IBV_EVENT_SRQ_LIMIT_REACHED && e.element.srq == recv_.srq;
      v_.ack_async_event(&e);
      if (ours) {
        rearm_limit_ = true;
        const uint64_t n = rx_queue_empty_.fetch_add(1, std::memory_order_relaxed) + 1;
        if (empty_report_.Due(n)) {
          DLCP_LOG(Warning) << "the RDMA receive queue on " << dev_.name << " (" << recv_.slots
                            << " buffers) ran dry, " << n << " time(s) in all: the NIC drops what arrives until "
                            << "buffers are posted again, counted only in the port's hw_counters (mlx5: "
                            << "out_of_buffer); this is loss on the host, not the network: raise --rdma-recv-slots, "
                            << "or add data threads";
        }
      } else if (IsFault(type)) {
        DLCP_LOG(Warning) << "RDMA device " << dev_.name << " reports " << v_.event_type_str(type);
      } else {
        DLCP_LOG(Info) << "RDMA device " << dev_.name << " reports " << v_.event_type_str(type);
      }
    }
  }

  void DrainEvent(ibv_comp_channel* channel) {
    ibv_cq* cq = nullptr;
    void* ctx = nullptr;
    while (v_.get_cq_event(channel, &cq, &ctx) == 0) v_.ack_cq_events(cq, 1);
  }

  absl::StatusOr<ibv_ah*> AddressHandle(const Address& to, uint8_t priority) {
    if (to.qpn == 0) {
      return absl::InvalidArgumentError(absl::StrCat("RDMA destination ", to.ToString(), " has no queue pair number"));
    }
    const uint64_t key = static_cast<uint64_t>(to.ipv4) << 8 | (priority & 3);
    if (auto it = ahs_.find(key); it != ahs_.end()) return it->second;
    ibv_ah_attr a{};
    a.is_global = 1;
    rdma::Ipv4ToGid(to.ipv4, a.grh.dgid.raw);
    a.grh.sgid_index = static_cast<uint8_t>(dev_.gid_index);
    a.grh.hop_limit = 64;
    a.grh.traffic_class = static_cast<uint8_t>(options_.dscp[priority & 3] << 2);
    a.port_num = dev_.port_num;
    ibv_ah* ah = v_.create_ah(pd_, &a);
    if (ah == nullptr) {
      return absl::UnavailableError(absl::StrCat("cannot create an RDMA address handle for ", to.HostString(), " on ",
                                                 dev_.name, " (", std::strerror(errno),
                                                 "): is it reachable from the GID's interface?"));
    }
    ahs_.emplace(key, ah);
    return ah;
  }

  const rdma::Verbs& v_;
  TransportOptions options_;
  rdma::DevicePort dev_;
  Address local_;
  size_t max_datagram_ = 0;
  uint32_t max_inline_ = 0;
  Waker waker_;

  ibv_pd* pd_ = nullptr;
  std::vector<ibv_qp*> qps_;  // the first is the endpoint's address; the rest only send
  // The receive side: its completion channel and queue, the shared receive queue and the
  // registered pool of receive buffers. Only the I/O thread touches it once Init has.
  struct ReceiveSide {
    ibv_comp_channel* channel = nullptr;
    ibv_cq* cq = nullptr;
    ibv_srq* srq = nullptr;
    ibv_mr* mr = nullptr;
    uint8_t* pool = nullptr;
    size_t slot_size = 0;
    uint32_t slots = 0;
    std::vector<ibv_wc> wc;
    std::vector<uint32_t> returned;  // slots handed out by the last Receive, re-posted by the next
  };
  ReceiveSide recv_;
  // Asynchronous events (TakeAsyncEvents) are read at most once per interval, with a Receive.
  static constexpr absl::Duration kEventCheckInterval = absl::Milliseconds(1);
  absl::Time next_event_check_ = absl::InfinitePast();
  bool rearm_limit_ = false;
  std::atomic<uint64_t> rx_queue_empty_{0};  // times the shared receive queue ran dry (OwnCounters)
  bool limit_unsupported_ = false;
  DoublingReport empty_report_;

  // The send side: its completion channel and queue, and the ring of registered send buffers, with
  // where each send went. Under send_mu_ once Init has.
  std::mutex send_mu_;
  struct SendSide {
    ibv_comp_channel* channel = nullptr;
    ibv_cq* cq = nullptr;
    ibv_mr* mr = nullptr;
    uint8_t* pool = nullptr;
    size_t slot_size = 0;
    uint32_t slots = 0;
    uint64_t posted = 0;     // sends posted (the next one's sequence number)
    uint64_t completed = 0;  // sends known complete: their slots are free
    std::vector<uint16_t> slot_qp;         // per slot: the queue pair its send went out on
    std::vector<uint64_t> completed_upto;  // per queue pair: its sends below this are complete
    size_t qp_index = 0;                   // the queue pair of the current burst
    size_t burst_used = 0;                 // sends in the current burst
    size_t last_qp = SIZE_MAX;             // the queue pair of the last list posted
  };
  SendSide send_;
  std::unordered_map<uint64_t, ibv_ah*> ahs_;  // (ipv4, class) -> handle with that class's DSCP
};

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> CreateRdmaTransport(const TransportOptions& options) {
  absl::StatusOr<const rdma::Verbs*> verbs = rdma::LoadVerbs();
  if (!verbs.ok()) return verbs.status();
  auto t = std::make_unique<RdmaTransport>(**verbs, options);
  if (absl::Status s = t->Init(); !s.ok()) return s;
  return t;
}

}  // namespace dlcp
