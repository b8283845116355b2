#include "common/transport/rdma/rdma_device.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/transport/address.h"
#include "common/transport/rdma/grh.h"
#include "common/transport/transport_options.h"

namespace dlcp::rdma {
namespace {

size_t MtuBytes(ibv_mtu mtu) { return size_t{128} << static_cast<int>(mtu); }

// The port's RoCEv2 GID with an IPv4-mapped address (that address, if want_ipv4 is set).
absl::StatusOr<std::pair<int, uint32_t>> FindRoceV2Gid(const Verbs& v, ibv_context* ctx, const std::string& name,
                                                       const RdmaOptions& o, int table_len, uint32_t want_ipv4) {
  const int first = o.gid_index >= 0 ? o.gid_index : 0;
  const int last = o.gid_index >= 0 ? o.gid_index + 1 : table_len;
  for (int i = first; i < last; ++i) {
    ibv_gid_entry e{};
    if (v.query_gid_ex(ctx, o.port_num, static_cast<uint32_t>(i), &e, 0, sizeof(e)) != 0) continue;  // empty slot
    if (e.gid_type != IBV_GID_TYPE_ROCE_V2) continue;
    std::optional<uint32_t> ip = GidToIpv4(e.gid.raw);
    if (!ip || (want_ipv4 != 0 && *ip != want_ipv4)) continue;
    return std::make_pair(i, *ip);
  }
  std::string which = want_ipv4 != 0 ? absl::StrCat(" for ", Address{want_ipv4, 0}.HostString()) : "";
  if (o.gid_index >= 0) {
    return absl::NotFoundError(absl::StrCat(name, " port ", o.port_num, " GID index ", o.gid_index,
                                            " is not a RoCEv2 IPv4 GID", which,
                                            " (see show_gids or /sys/class/infiniband/", name, "/ports/", o.port_num,
                                            "/gid_attrs/types; or leave the GID index unset to search)"));
  }
  return absl::NotFoundError(absl::StrCat(name, " port ", o.port_num, " has no RoCEv2 IPv4 GID", which,
                                          ": give its network interface that IPv4 address"));
}

absl::StatusOr<DevicePort> TryDevice(const Verbs& v, ibv_device* dev, const RdmaOptions& o, uint32_t want_ipv4) {
  DevicePort d;
  d.name = v.get_device_name(dev);
  d.port_num = o.port_num;
  d.context = v.open_device(dev);
  if (d.context == nullptr) {
    return absl::PermissionDeniedError(absl::StrCat("cannot open ", d.name, " (errno ", errno,
                                                    "): is /dev/infiniband/uverbs* readable and writable here?"));
  }
  auto fail = [&](absl::Status s) {
    v.close_device(d.context);
    return s;
  };
  if (v.query_device(d.context, &d.attr) != 0) return fail(absl::InternalError(absl::StrCat("ibv_query_device ", d.name)));
  if (o.port_num == 0 || o.port_num > d.attr.phys_port_cnt) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat(d.name, " has ", static_cast<int>(d.attr.phys_port_cnt), " port(s); port ", o.port_num, " asked for")));
  }
  ibv_port_attr port{};
  if (v.QueryPort(d.context, o.port_num, &port) != 0) {
    return fail(absl::InternalError(absl::StrCat("ibv_query_port ", d.name, " port ", o.port_num)));
  }
  if (port.link_layer != IBV_LINK_LAYER_ETHERNET) {
    return fail(absl::FailedPreconditionError(absl::StrCat(
        d.name, " port ", o.port_num, " is InfiniBand; dlcp's RDMA transport speaks RoCEv2 (Ethernet link layer)")));
  }
  if (port.state != IBV_PORT_ACTIVE) {
    return fail(absl::UnavailableError(absl::StrCat(d.name, " port ", o.port_num, " is not active (state ",
                                                    static_cast<int>(port.state),
                                                    "): bring its network interface up and check the link")));
  }
  absl::StatusOr<std::pair<int, uint32_t>> gid = FindRoceV2Gid(v, d.context, d.name, o, port.gid_tbl_len, want_ipv4);
  if (!gid.ok()) return fail(gid.status());
  d.gid_index = gid->first;
  d.ipv4 = gid->second;
  d.mtu = MtuBytes(port.active_mtu);
  return d;
}

}  // namespace

absl::StatusOr<DevicePort> OpenDevicePort(const Verbs& v, const RdmaOptions& o, uint32_t want_ipv4) {
  int n = 0;
  ibv_device** list = v.get_device_list(&n);
  if (list == nullptr || n == 0) {
    if (list != nullptr) v.free_device_list(list);
    return absl::NotFoundError(
        "no RDMA device: ibv_get_device_list found none (load the NIC's RDMA driver, e.g. mlx5_ib, or add a "
        "Soft-RoCE device: rdma link add rxe0 type rxe netdev eth0); or use --transport=udp");
  }
  std::vector<std::string> why;
  absl::StatusOr<DevicePort> chosen = absl::NotFoundError("");
  for (int i = 0; i < n; ++i) {
    const std::string name = v.get_device_name(list[i]);
    if (!o.device.empty() && name != o.device) continue;
    chosen = TryDevice(v, list[i], o, want_ipv4);
    if (chosen.ok()) break;
    why.push_back(std::string(chosen.status().message()));
  }
  v.free_device_list(list);
  if (chosen.ok()) return chosen;
  if (why.empty()) return absl::NotFoundError(absl::StrCat("no RDMA device named '", o.device, "'"));
  if (why.size() == 1) return chosen.status();
  return absl::Status(chosen.status().code(), absl::StrCat("no usable RDMA device: ", absl::StrJoin(why, "; ")));
}

}  // namespace dlcp::rdma
