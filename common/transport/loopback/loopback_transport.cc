#include "common/transport/loopback/loopback_transport.h"

#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "common/transport/transport_options.h"

namespace dlcp {
namespace {

constexpr uint32_t kLoopbackIp = 0x7f000001;

struct Datagram {
  Address from;
  std::vector<uint8_t> bytes;
};

// One endpoint's receive queue. Shared between the hub (senders) and its transport (receiver).
struct Mailbox {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Datagram> queue;
  size_t queued_bytes = 0;
  size_t capacity_bytes = 0;
  bool woken = false;
};

// Process-wide port registry. Lookups take one mutex; mailboxes have their own.
class Hub {
 public:
  static Hub& Get() {
    static Hub* hub = new Hub();
    return *hub;
  }

  absl::StatusOr<uint16_t> Register(uint16_t port, std::shared_ptr<Mailbox> box) {
    std::lock_guard<std::mutex> lock(mu_);
    if (port == 0) {
      for (int tries = 0; tries < 65535; ++tries) {
        next_ = next_ == 65535 ? 1024 : next_ + 1;
        if (!boxes_.count(next_)) {
          port = next_;
          break;
        }
      }
      if (port == 0) return absl::ResourceExhaustedError("loopback: no free port");
    } else if (boxes_.count(port)) {
      return absl::AlreadyExistsError(absl::StrCat("loopback port ", port, " in use"));
    }
    boxes_[port] = std::move(box);
    return port;
  }

  void Unregister(uint16_t port) {
    std::lock_guard<std::mutex> lock(mu_);
    boxes_.erase(port);
  }

  std::shared_ptr<Mailbox> Find(uint16_t port) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = boxes_.find(port);
    return it == boxes_.end() ? nullptr : it->second;
  }

 private:
  std::mutex mu_;
  std::map<uint16_t, std::shared_ptr<Mailbox>> boxes_;
  uint16_t next_ = 20000;
};

class LoopbackTransport final : public Transport {
 public:
  LoopbackTransport(const TransportOptions& options, std::shared_ptr<Mailbox> box, uint16_t port)
      : options_(options), box_(std::move(box)), port_(port) {}
  ~LoopbackTransport() override { Hub::Get().Unregister(port_); }

  Address local_address() const override { return Address{kLoopbackIp, port_}; }
  TransportOptions::Kind kind() const override { return TransportOptions::Kind::kLoopback; }
  size_t max_datagram() const override { return options_.max_datagram; }

  absl::Status Send(absl::Span<const OutMessage> messages, absl::Time deadline) override {
    for (const OutMessage& m : messages) {
      const size_t len = m.size();
      if (len > options_.max_datagram) {
        return absl::InvalidArgumentError(
            absl::StrCat("datagram of ", len, " bytes exceeds max_datagram ", options_.max_datagram));
      }
      counters_.sent_packets.fetch_add(1, std::memory_order_relaxed);
      counters_.path_packets[0].fetch_add(1, std::memory_order_relaxed);
      counters_.sent_bytes.fetch_add(len, std::memory_order_relaxed);
      std::shared_ptr<Mailbox> dst = Hub::Get().Find(m.to.port);
      if (!dst) {  // like UDP to a closed port: silently gone
        counters_.dropped.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      Datagram d{local_address(), std::vector<uint8_t>(len)};
      std::memcpy(d.bytes.data(), m.header, m.header_len);
      if (m.payload_len) std::memcpy(d.bytes.data() + m.header_len, m.payload, m.payload_len);
      if (m.trailer_len) std::memcpy(d.bytes.data() + m.header_len + m.payload_len, m.trailer, m.trailer_len);
      std::lock_guard<std::mutex> lock(dst->mu);
      if (dst->queued_bytes + len > dst->capacity_bytes) {
        counters_.dropped.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      dst->queued_bytes += len;
      dst->queue.push_back(std::move(d));
      dst->cv.notify_one();
    }
    return absl::OkStatus();
  }

  absl::Status Receive(std::vector<InMessage>* out, absl::Duration timeout) override {
    out->clear();
    held_.clear();
    std::unique_lock<std::mutex> lock(box_->mu);
    const absl::Time deadline = MonotonicNow() + timeout;
    while (box_->queue.empty() && !box_->woken) {
      absl::Duration left = deadline - MonotonicNow();
      if (left <= absl::ZeroDuration()) break;
      box_->cv.wait_for(lock, absl::ToChronoNanoseconds(left));
    }
    box_->woken = false;
    while (!box_->queue.empty() && held_.size() < options_.recv_batch) {
      box_->queued_bytes -= box_->queue.front().bytes.size();
      held_.push_back(std::move(box_->queue.front()));
      box_->queue.pop_front();
    }
    lock.unlock();
    for (const Datagram& d : held_) {
      counters_.recv_packets.fetch_add(1, std::memory_order_relaxed);
      counters_.recv_bytes.fetch_add(d.bytes.size(), std::memory_order_relaxed);
      out->push_back(InMessage{d.from, d.bytes.data(), d.bytes.size()});
    }
    return absl::OkStatus();
  }

  void Wake() override {
    std::lock_guard<std::mutex> lock(box_->mu);
    box_->woken = true;
    box_->cv.notify_all();
  }

 private:
  TransportOptions options_;
  std::shared_ptr<Mailbox> box_;
  uint16_t port_;
  std::vector<Datagram> held_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> CreateLoopbackTransport(const TransportOptions& options) {
  auto box = std::make_shared<Mailbox>();
  box->capacity_bytes = options.socket_buffer_bytes;
  absl::StatusOr<uint16_t> port = Hub::Get().Register(options.port, box);
  if (!port.ok()) return port.status();
  return std::unique_ptr<Transport>(new LoopbackTransport(options, std::move(box), *port));
}

}  // namespace dlcp
