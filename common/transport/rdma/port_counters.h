// An RDMA port's own counters, as its driver exports them in sysfs
// (<sysfs_root>/class/infiniband/<device>/ports/<port>/hw_counters/<name>). They count what no
// verbs call reports. Above all, mlx5's out_of_buffer counts the datagrams a NIC dropped because
// the receive queue had no buffer posted, where the transport's own "rx_queue_empty"
// (Transport::OwnCounters) counts only how often a queue ran dry. Soft-RoCE exports its own set
// (sent_pkts, rcvd_pkts, ...).
//
// Plain file reads, no verbs, so it builds and is tested without RDMA. Blocks for a few system
// calls: call it from a metrics or logging thread, not an I/O thread. Thread-safe (no state).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/transport/port_counter_source.h"

namespace dlcp {

// Every counter of the port, sorted by name. `lifespan` is left out: it is the driver's cache
// period in milliseconds, a setting, not a count. NotFound if the port exports none.
absl::StatusOr<std::vector<PortCounter>> ReadPortCounters(const std::string& sysfs_root, const std::string& device,
                                                          uint32_t port);
// One counter of the port.
absl::StatusOr<uint64_t> ReadPortCounter(const std::string& sysfs_root, const std::string& device, uint32_t port,
                                         const std::string& name);

}  // namespace dlcp
