// A NIC port's own counters, as its driver exports them: what no verbs call or socket option
// reports, such as the datagrams a NIC dropped for want of a posted receive buffer (mlx5's
// out_of_buffer). An optional interface: a transport with a port of its own (RDMA) offers one
// through Transport::port_counters(); UDP and loopback have none.
//
// Reads files: call it from a metrics or logging thread, never an I/O thread. Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dlcp {

struct PortCounter {
  std::string name;
  uint64_t value = 0;
};

class PortCounterSource {
 public:
  virtual ~PortCounterSource() = default;
  // Every counter of the port, sorted by name.
  virtual absl::StatusOr<std::vector<PortCounter>> ReadAll() const = 0;
  // One counter; NotFound if the port has none of that name.
  virtual absl::StatusOr<uint64_t> Read(const std::string& name) const = 0;
};

}  // namespace dlcp
