// The data-plane transport: moves datagrams and their priority marks, nothing more. It never
// parses dlcp headers. One implementation per folder (udp/, loopback/, rdma/), made by
// CreateTransport (factory.h) from TransportOptions (transport_options.h); this header knows none
// of them.
//
// Threading: Send and Wake may be called from any number of threads at once. Receive must be
// called by one thread at a time (the endpoint's I/O thread); the buffers it returns stay valid
// until that thread's next Receive. Nothing blocks without a deadline.
#pragma once

#include <array>
#include <atomic>
#include <map>
#include <string>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/transport/address.h"
#include "common/transport/port_counter_source.h"

namespace dlcp {

// What a transport is. kAuto: RDMA where a device is usable, otherwise UDP (CreateTransport logs
// why); never the kind of a transport made.
enum class TransportKind { kAuto, kUdp, kLoopback, kRdma };

// A datagram to send, gathered from a header, a payload and a trailer, so payloads go out
// without a copy.
struct OutMessage {
  Address to;
  uint8_t priority = 0;  // class 0..3, mapped to a DSCP code point by the transport
  const uint8_t* header = nullptr;
  size_t header_len = 0;
  const uint8_t* payload = nullptr;
  size_t payload_len = 0;
  const uint8_t* trailer = nullptr;
  size_t trailer_len = 0;
  // Which of the transport's send paths (send_paths()) it leaves from; -1: the transport's own
  // rotation (spray_burst datagrams per path in turn).
  int16_t path = -1;

  size_t size() const { return header_len + payload_len + trailer_len; }
};

struct InMessage {
  Address from;
  const uint8_t* data = nullptr;
  size_t len = 0;
  // The DSCP code point the datagram arrived with, where the transport sees it (RDMA reads it
  // from the GRH of every receive); -1 where it does not.
  int dscp = -1;
};

struct TransportCounters {
  std::atomic<uint64_t> sent_packets{0};
  std::atomic<uint64_t> sent_bytes{0};
  std::atomic<uint64_t> recv_packets{0};
  std::atomic<uint64_t> recv_bytes{0};
  std::atomic<uint64_t> send_would_block{0};  // times a send waited for buffer space
  std::atomic<uint64_t> dropped{0};           // known drops (loopback queue full, oversize)
  // Datagrams the kernel dropped because the receive socket's buffer was full (UDP: the
  // socket's SO_RXQ_OVFL count). The kernel reports them on the next datagram it delivers, so
  // drops in a burst that nothing follows show up only once traffic resumes.
  std::atomic<uint64_t> rx_overflows{0};
  std::atomic<uint64_t> spray_bursts{0};      // runs of datagrams sent from one source port
  // Datagrams sent on each send path (UDP: source port, RDMA: queue pair), by the path's index
  // (Transport::send_paths); the first only where datagrams cannot choose. How spraying and
  // steering shared the traffic out, to read beside the switches' per-port counters.
  static constexpr size_t kMaxPaths = 64;  // TransportOptions::spray_ports at most
  std::array<std::atomic<uint64_t>, kMaxPaths> path_packets{};
};

class Transport {
 public:
  virtual ~Transport() = default;

  // UDP: the bound address. RDMA: the IPv4 address of the RoCEv2 GID and the queue pair number.
  virtual Address local_address() const = 0;
  // The largest datagram Send accepts: options.max_datagram, or less (RDMA: the port's MTU).
  virtual size_t max_datagram() const = 0;
  // What this transport is (never kAuto).
  virtual TransportKind kind() const = 0;
  // The other addresses datagrams leave from when spraying (UDP: ports, RDMA: queue pairs), for
  // peers that check sources; nobody sends to them. Empty when every datagram leaves from
  // local_address().
  virtual std::vector<Address> spray_sources() const { return {}; }
  // How many paths OutMessage::path may choose among (UDP: the spray ports, RDMA: the queue
  // pairs); 1 where messages cannot choose.
  virtual size_t send_paths() const { return 1; }
  // The NIC port's own counters (port_counter_source.h), where the transport has a port of its own
  // (RDMA); nullptr where it has none (UDP, loopback). Lives as long as the transport.
  virtual const PortCounterSource* port_counters() const { return nullptr; }
  // Where it runs, for the info metric and operators: RDMA gives device, port and gid_index;
  // UDP and loopback nothing.
  virtual std::map<std::string, std::string> where() const { return {}; }

  // Hands every message to the network, in order, or fails. Waits for local buffer space until
  // `deadline` at most; never waits for the peer. A datagram the network drops later is not an
  // error: delivery is the protocol's job.
  virtual absl::Status Send(absl::Span<const OutMessage> messages, absl::Time deadline) = 0;

  // Waits up to `timeout` for datagrams, then returns those that are ready in `out`, which it
  // clears first: at most recv_batch receive buffers' worth, where one buffer holds one datagram,
  // or several when UDP GRO coalesced them. Zero messages means timeout or Wake().
  virtual absl::Status Receive(std::vector<InMessage>* out, absl::Duration timeout) = 0;

  // Makes a Receive that is blocked now, or the next one, return promptly.
  virtual void Wake() = 0;

  const TransportCounters& counters() const { return counters_; }
  // Counters of what only this transport has, by name: UDP's "gso_sends" (super-datagrams sent
  // through segmentation offload), RDMA's "rx_queue_empty" (times its shared receive queue ran
  // dry, its limit event armed at one posted buffer: the NIC drops what arrives while no buffer
  // is posted, counted only in the port's counters, port_counters()). Any thread.
  virtual std::vector<std::pair<std::string_view, uint64_t>> OwnCounters() const { return {}; }
  // One of them; 0 where this transport has no such counter.
  uint64_t OwnCounter(std::string_view name) const {
    for (const auto& [n, v] : OwnCounters()) {
      if (n == name) return v;
    }
    return 0;
  }

 protected:
  TransportCounters counters_;
};

}  // namespace dlcp
