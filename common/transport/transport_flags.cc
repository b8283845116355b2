#include "common/transport/transport_flags.h"

#include "absl/strings/str_cat.h"
#include "common/transport/transport_options.h"

namespace dlcp {

void DeclareTransportFlags(ConfigRegistry* c) {
  c->AddString("transport", "auto",
               "data plane: rdma (RoCEv2 verbs), udp, or auto (rdma where a device is usable, else udp; logs why)",
               [](const std::string& v) -> absl::Status {
                 absl::StatusOr<TransportOptions::Kind> k = ParseTransportKind(v);
                 if (!k.ok()) return k.status();
                 if (*k == TransportOptions::Kind::kLoopback) {
                   return absl::InvalidArgumentError("loopback is in-process only (tests); use auto, udp or rdma");
                 }
                 return absl::OkStatus();
               });
  c->AddBool("udp-offload", true, "UDP GSO on send and GRO on receive, where the kernel supports them");
  c->AddInt("spray-ports", 16, 1, 64,
            "UDP source ports each endpoint sends from in turn, so ECMP spreads it over every path; 1: off");
  c->AddInt("spray-burst", 0, 0, 64,
            "datagrams sent from one source port before the next takes over; 0: 4 for datagrams over 4 KiB "
            "(jumbo frames), 8 otherwise");
  c->AddString("rdma-device", "", "RDMA device (e.g. mlx5_0, rxe0); empty: the first with an active RoCEv2 port");
  c->AddInt("rdma-port", 1, 1, 255, "RDMA device port");
  c->AddInt("rdma-gid-index", -1, -1, 65535, "RoCEv2 GID index; -1 searches the GID table for the IPv4 RoCEv2 GID");
  c->AddInt("rdma-qkey", 0x0d1c0001, 1, 0x7fffffff, "Q_Key of every dlcp queue pair; the same on workers and aggregators");
  c->AddInt("rdma-recv-slots", 4096, 64, 65536,
            "receive buffers per RDMA endpoint (one datagram each, registered); at most the device's queue depth");
}

void TransportOptionsFromConfig(const ConfigRegistry& c, TransportOptions* o) {
  o->kind = *ParseTransportKind(c.GetString("transport"));  // validated as a flag
  o->udp.gso = o->udp.gro = c.GetBool("udp-offload");
  o->spray_ports = static_cast<uint32_t>(c.GetInt("spray-ports"));
  o->spray_burst = static_cast<uint32_t>(c.GetInt("spray-burst"));
  o->rdma.device = c.GetString("rdma-device");
  o->rdma.port_num = static_cast<uint8_t>(c.GetInt("rdma-port"));
  o->rdma.gid_index = static_cast<int>(c.GetInt("rdma-gid-index"));
  o->rdma.qkey = static_cast<uint32_t>(c.GetInt("rdma-qkey"));
  o->rdma.recv_slots = static_cast<uint32_t>(c.GetInt("rdma-recv-slots"));
}

}  // namespace dlcp
