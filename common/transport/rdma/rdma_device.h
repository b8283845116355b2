// Choosing and opening the RDMA device, port and GID an endpoint uses. Each failure names what
// is wrong and the fix: no device, a port that is down, no RoCEv2 IPv4 GID, an InfiniBand port.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/transport/rdma/verbs_loader.h"
#include "common/transport/transport.h"
#include "common/transport/rdma/rdma_options.h"

namespace dlcp::rdma {

struct DevicePort {
  ibv_context* context = nullptr;  // owned by the caller: close with Verbs::close_device
  std::string name;
  ibv_device_attr attr{};
  uint8_t port_num = 1;
  int gid_index = -1;
  uint32_t ipv4 = 0;  // of the chosen RoCEv2 GID
  size_t mtu = 0;     // the port's active MTU in bytes: the largest datagram
};

// Opens options.device (or, if empty, the first device with a usable port). `want_ipv4`, when
// not 0, picks the device and GID that carry that address (dlcpd --host, a client's data_host).
absl::StatusOr<DevicePort> OpenDevicePort(const Verbs& verbs, const RdmaOptions& options, uint32_t want_ipv4);

}  // namespace dlcp::rdma
