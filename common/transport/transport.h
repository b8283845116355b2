// The data-plane transport: moves datagrams and their priority marks, nothing more. It never
// parses dlcp headers. One implementation per folder (udp/, loopback/, rdma/), made by
// CreateTransport from TransportOptions.
//
// Threading: Send and Wake may be called from any number of threads at once. Receive must be
// called by one thread at a time (the endpoint's I/O thread); the buffers it returns stay valid
// until that thread's next Receive. Nothing blocks without a deadline.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/transport/address.h"
#include "common/transport/port_counter_source.h"

namespace dlcp {

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
  // Times the receive queue ran dry (RDMA: the shared receive queue's limit event, armed at one
  // posted buffer). The NIC drops what arrives while no buffer is posted, counted by no verbs
  // call (only the port's counters do, port_counters()), so this says only that it may have: the
  // I/O thread fell a whole queue behind.
  std::atomic<uint64_t> rx_queue_empty{0};
  std::atomic<uint64_t> gso_sends{0};         // super-datagrams sent through UDP GSO
  std::atomic<uint64_t> spray_bursts{0};      // runs of datagrams sent from one source port
  // Datagrams sent on each send path (UDP: source port, RDMA: queue pair), by the path's index
  // (Transport::send_paths); the first only where datagrams cannot choose. How spraying and
  // steering shared the traffic out, to read beside the switches' per-port counters.
  static constexpr size_t kMaxPaths = 64;  // TransportOptions::spray_ports at most
  std::array<std::atomic<uint64_t>, kMaxPaths> path_packets{};
};

// RDMA (RoCEv2, unreliable datagram) settings; common/transport/rdma/rdma_transport.h.
struct RdmaOptions {
  std::string device;   // e.g. "mlx5_0" or "rxe0"; empty: the first with an active RoCEv2 port
  uint8_t port_num = 1;
  int gid_index = -1;   // -1: search the GID table for the port's RoCEv2 IPv4 GID
  // Every dlcp queue pair of a deployment uses the same Q_Key; it is checked at join. Keys with
  // the top bit set are privileged, so they are refused.
  uint32_t qkey = 0x0d1c0001;
  uint32_t recv_slots = 4096;  // receive buffers on the shared receive queue
  uint32_t send_slots = 1024;  // registered send buffers (and send queue depth)
  uint32_t signal_every = 16;  // one signalled send per this many; divides send_slots
};

struct TransportOptions {
  // kAuto: RDMA where a device is usable, otherwise UDP (CreateTransport logs why).
  enum class Kind { kAuto, kUdp, kLoopback, kRdma };
  Kind kind = Kind::kAuto;
  // Its family is the endpoint's: an IPv6 address ("::", "fd00::7") makes an IPv6-only UDP
  // endpoint, which sends to IPv6 peers alone. A Client moves the default to "::" when its first
  // aggregator has only an IPv6 address. RDMA takes IPv4 alone.
  std::string bind_host = "0.0.0.0";
  uint16_t port = 0;  // 0 picks a free port
  size_t max_datagram = 65507;
  size_t recv_batch = 64;
  // Socket buffers; large, because a round's window of chunks arrives as one burst.
  size_t socket_buffer_bytes = 32 << 20;
  // DSCP code point for each priority class.
  std::array<uint8_t, 4> dscp = {46, 34, 18, 0};
  // Spin on the socket instead of sleeping in poll(2). Only for dedicated cores.
  bool busy_poll = false;
  // UDP only: batch same-size datagrams to one peer into one GSO send, and accept coalesced
  // (GRO) receives. Both fall back silently where the kernel or path does not support them.
  bool gso = true;
  bool gro = true;
  // UDP path spraying (docs/path-spraying.md): datagrams leave from this many source ports in
  // turn, so switches that hash the 5-tuple (ECMP) spread one endpoint's traffic over every
  // path. Each port carries a burst of up to spray_burst datagrams before the next takes over.
  // 1 turns spraying off. One extra socket per port serves every peer.
  uint32_t spray_ports = 16;
  // 0 chooses by datagram size (SprayBurstFor). Shorter bursts spread a window more evenly over
  // the paths, but each burst is one GSO send, so they cost sends: with jumbo frames 4 was
  // faster on every bed measured, while at MTU 1500 a CPU-bound node lost more to the extra
  // sends than it gained (docs/measurements/path-spraying.md, "Shorter bursts").
  uint32_t spray_burst = 0;
  static constexpr uint32_t kJumboSprayBurst = 4;
  static constexpr uint32_t kSprayBurst = 8;
  static constexpr size_t kJumboDatagram = 4096;  // larger than any RoCE MTU: RDMA keeps 8
  uint32_t SprayBurstFor(size_t datagram_bytes) const {
    if (spray_burst != 0) return spray_burst;
    return datagram_bytes > kJumboDatagram ? kJumboSprayBurst : kSprayBurst;
  }
  RdmaOptions rdma;
};

absl::StatusOr<TransportOptions::Kind> ParseTransportKind(const std::string& name);
const char* TransportKindName(TransportOptions::Kind kind);
// Parses "46,34,18,0" into one DSCP code point per class (TransportOptions::dscp).
absl::Status ParseDscpMap(const std::string& text, std::array<uint8_t, 4>* out);

class Transport {
 public:
  virtual ~Transport() = default;

  // UDP: the bound address. RDMA: the IPv4 address of the RoCEv2 GID and the queue pair number.
  virtual Address local_address() const = 0;
  // The largest datagram Send accepts: options.max_datagram, or less (RDMA: the port's MTU).
  virtual size_t max_datagram() const = 0;
  // What this transport is (never kAuto).
  virtual TransportOptions::Kind kind() const = 0;
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

 protected:
  TransportCounters counters_;
};

absl::StatusOr<std::unique_ptr<Transport>> CreateTransport(const TransportOptions& options);

}  // namespace dlcp
