// Bounds on the TCP connections dlcpd's gRPC ports hold: overall, and per peer address. gRPC
// 1.51 has neither, so one client could hold every file descriptor dlcpd has with connections
// that never send a byte. LimitedListener asks the limiter about each connection it accepts,
// before gRPC sees it. Connections that get in but never finish their handshake, or go idle,
// are gRPC's to close (its handshake and idle timeouts); the limiter notices they are gone.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace dlcp {

struct ConnectionLimits {
  uint32_t max_connections = 4096;
  uint32_t max_per_peer = 256;
};

// Thread-safe: gRPC's accept threads call Admit.
class ConnectionLimiter {
 public:
  explicit ConnectionLimiter(ConnectionLimits limits) : limits_(limits) {}

  enum class Verdict { kAdmitted, kOverall, kPerPeer };
  // For a connection just accepted: counts it, or says which limit it would break (the caller
  // then closes it). One that is not a connected IP socket is admitted uncounted.
  Verdict Admit(int fd);
  // Forgets connections gRPC has closed since, so held() is current; for a periodic caller.
  void Refresh();
  // Marks the connection from host:port (as accepted, if it still is) to be shut down at `at`:
  // for a caller refused for good, once its answer has had time to reach it. gRPC then closes it.
  void CloseLater(const std::string& host, uint16_t port, absl::Time at);
  // Shuts down the marked connections that are due; for a periodic caller.
  void CloseDue(absl::Time now);

  uint64_t held() const { return held_.load(std::memory_order_relaxed); }
  uint64_t refused_overall() const { return refused_overall_.load(std::memory_order_relaxed); }
  uint64_t refused_per_peer() const { return refused_per_peer_.load(std::memory_order_relaxed); }
  uint64_t closed_later() const { return closed_later_.load(std::memory_order_relaxed); }
  const ConnectionLimits& limits() const { return limits_; }

 private:
  struct Held {
    ino_t inode;
    std::string peer;
    uint16_t port;
  };
  struct Closing {
    int fd;
    ino_t inode;  // the socket's: the fd may be closed and reused before `at`
    absl::Time at;
  };
  // Forgets connections gRPC has closed since: their fd is gone, or now names another socket.
  void Sweep();  // with mu_ held
  void Forget(std::map<int, Held>::iterator it);  // with mu_ held

  const ConnectionLimits limits_;
  std::mutex mu_;
  std::map<int, Held> by_fd_;
  std::map<std::string, uint32_t> per_peer_;
  std::vector<Closing> closing_;
  absl::Time last_sweep_ = absl::InfinitePast();
  std::atomic<uint64_t> held_{0};
  std::atomic<uint64_t> refused_overall_{0};
  std::atomic<uint64_t> refused_per_peer_{0};
  std::atomic<uint64_t> closed_later_{0};
};

}  // namespace dlcp
