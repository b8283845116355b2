// RDMA (RoCEv2, unreliable datagram) settings of a transport (TransportOptions::rdma);
// common/transport/rdma/rdma_transport.h uses them.
#pragma once

#include <cstdint>
#include <string>

namespace dlcp {

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

}  // namespace dlcp
