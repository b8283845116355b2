#include "client/ctl/doctor.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "client/host/stage_join.h"
#include "common/base/clock.h"
#include "common/base/json_text.h"
#include "common/shm/stage_layout.h"
#include "common/transport/rdma/rdma_options.h"

namespace dlcp::ctl {
namespace {

namespace fs = std::filesystem;
using Level = Finding::Level;

std::optional<std::string> ReadLine(const fs::path& p) {
  std::ifstream in(p);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return std::string(absl::StripAsciiWhitespace(line));
}

std::optional<int64_t> ReadInt(const fs::path& p) {
  int64_t v = 0;
  std::optional<std::string> s = ReadLine(p);
  return s && absl::SimpleAtoi(*s, &v) ? std::optional<int64_t>(v) : std::nullopt;
}

// The RoCE MTU the kernel derives from a network interface's: the largest IB MTU that fits once
// the GRH, BTH and the largest extension headers are taken off (rdma-core's iboe_get_mtu).
int64_t RoceMtuFor(int64_t netdev_mtu) {
  const int64_t room = netdev_mtu - 40 - 12 - 4 - 28 - 4;
  for (int64_t mtu : {4096, 2048, 1024, 512, 256}) {
    if (mtu <= room) return mtu;
  }
  return 0;
}

// An IPv4-mapped GID (::ffff:a.b.c.d, as sysfs writes it: 0000:0000:0000:0000:0000:ffff:0a00:0001).
std::optional<std::string> Ipv4OfGid(const std::string& gid) {
  if (gid.size() != 39 || gid.compare(0, 30, "0000:0000:0000:0000:0000:ffff:") != 0) return std::nullopt;
  uint32_t hi = 0, lo = 0;
  if (!absl::SimpleHexAtoi(gid.substr(30, 4), &hi) || !absl::SimpleHexAtoi(gid.substr(35, 4), &lo)) return std::nullopt;
  return absl::StrFormat("%u.%u.%u.%u", hi >> 8, hi & 255, lo >> 8, lo & 255);
}

struct Gid {
  int index = -1;
  std::string ipv4, netdev;
};

// The port's first RoCEv2 GID with an IPv4 address: the one dlcp picks (rdma_gid_index = -1).
std::optional<Gid> PickGid(const fs::path& port) {
  for (int i = 0; i < 256; ++i) {
    std::optional<std::string> type = ReadLine(port / "gid_attrs/types" / std::to_string(i));
    if (!type) continue;
    if (*type != "RoCE v2") continue;
    std::optional<std::string> gid = ReadLine(port / "gids" / std::to_string(i));
    std::optional<std::string> ip = gid ? Ipv4OfGid(*gid) : std::nullopt;
    if (!ip) continue;
    return Gid{i, *ip, ReadLine(port / "gid_attrs/ndevs" / std::to_string(i)).value_or("")};
  }
  return std::nullopt;
}

// One port: its state and link layer, its GID, and its interface's MTU. Returns whether usable.
bool CheckPort(const DoctorOptions& o, const std::string& dev, const fs::path& port, std::vector<Finding>* out) {
  const std::string name = absl::StrCat("rdma port ", dev, "/", port.filename().string());
  const std::string state = ReadLine(port / "state").value_or("?");
  const std::string link = ReadLine(port / "link_layer").value_or("?");
  if (link != "Ethernet") {
    out->push_back({Level::kWarn, name, absl::StrCat("link layer ", link, ": dlcp speaks RoCEv2 (Ethernet) only")});
    return false;
  }
  if (state.find("ACTIVE") == std::string::npos) {
    out->push_back({Level::kFail, name, absl::StrCat("state ", state, ": bring its network interface up and check the link")});
    return false;
  }
  out->push_back({Level::kOk, name, absl::StrCat("state ", state, ", link layer Ethernet")});
  std::optional<Gid> gid = PickGid(port);
  if (!gid) {
    out->push_back({Level::kFail, name + " GID",
                    "no RoCEv2 GID with an IPv4 address: give the port's network interface an IPv4 address "
                    "(show_gids lists the table)"});
    return false;
  }
  out->push_back({Level::kOk, name + " GID",
                  absl::StrCat("dlcp would use index ", gid->index, " (RoCE v2, ", gid->ipv4, " on ",
                               gid->netdev.empty() ? "?" : gid->netdev, "); pin it with rdma_gid_index / DLCP_RDMA_GID_INDEX")});
  if (std::optional<int64_t> mtu = ReadInt(fs::path(o.sysfs) / "class/net" / gid->netdev / "mtu")) {
    const int64_t roce = RoceMtuFor(*mtu);
    const Level level = roce >= 4096 ? Level::kOk : Level::kWarn;
    out->push_back({level, absl::StrCat("mtu ", gid->netdev),
                    absl::StrCat("interface MTU ", *mtu, " gives RoCE an active MTU of ", roce,
                                 roce >= 4096 ? "" : ": every datagram carries less; set the interface's MTU to 4200 "
                                                     "or more (9000 on the fabric) for 4096")});
  }
  return true;
}

// What one RDMA endpoint registers (rdma_transport.cc): its receive and send slots of up to a
// 4 KiB datagram plus the GRH, page-rounded, per data thread.
size_t RdmaLockedBytes(const DoctorOptions& o) {
  const RdmaOptions r = o.probe.transport.rdma;
  return size_t{o.data_threads} * (size_t{r.recv_slots} + r.send_slots) * (4096 + 128);
}

// Whether this process may lock memory past its limit (CAP_IPC_LOCK in /proc/self/status's CapEff).
bool HasIpcLock(const DoctorOptions& o) {
  std::ifstream in(fs::path(o.procfs) / "self/status");
  std::string line;
  while (std::getline(in, line)) {
    uint64_t caps = 0;
    absl::string_view rest = line;
    if (absl::ConsumePrefix(&rest, "CapEff:") && absl::SimpleHexAtoi(absl::StripAsciiWhitespace(rest), &caps)) {
      return (caps >> 14) & 1;  // CAP_IPC_LOCK
    }
  }
  return false;
}

Finding CheckMemlock(const DoctorOptions& o, bool rdma) {
  rlimit lim{};
  getrlimit(RLIMIT_MEMLOCK, &lim);
  const size_t need = RdmaLockedBytes(o);
  const std::string have = lim.rlim_cur == RLIM_INFINITY ? "unlimited" : absl::StrCat(lim.rlim_cur / 1024, " KiB");
  if (rdma && HasIpcLock(o)) {
    return {Level::kOk, "memlock", absl::StrCat("limit ", have, ", lifted by the IPC_LOCK capability this process holds")};
  }
  if (!rdma || lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= need) {
    return {Level::kOk, "memlock", absl::StrCat("limit ", have, rdma ? absl::StrCat(", an RDMA endpoint needs about ", need / 1024, " KiB") : ", not needed without RDMA")};
  }
  return {Level::kFail, "memlock",
          absl::StrCat("limit ", have, ", but dlcpd over RDMA registers about ", need / 1024,
                       " KiB: raise it (ulimit -l unlimited; systemd LimitMEMLOCK=infinity; in Kubernetes the rdma "
                       "overlay's IPC_LOCK), or lower --rdma-recv-slots")};
}

std::vector<Finding> CheckUdpBuffers(const DoctorOptions& o) {
  std::vector<Finding> out;
  for (const char* which : {"rmem_max", "wmem_max"}) {
    const std::string name = absl::StrCat("net.core.", which);
    std::optional<int64_t> v = ReadInt(fs::path(o.procfs) / "sys/net/core" / which);
    if (!v) {
      out.push_back({Level::kWarn, name, "cannot be read here"});
    } else if (static_cast<size_t>(*v) < o.socket_buffer_bytes) {
      out.push_back({Level::kWarn, name,
                     absl::StrCat(*v, " bytes caps dlcp's UDP socket buffers below the ", o.socket_buffer_bytes,
                                  " they ask for, and bursts overflow them: sysctl -w ", name, "=",
                                  o.socket_buffer_bytes * 2)});
    } else {
      out.push_back({Level::kOk, name, absl::StrCat(*v, " bytes")});
    }
  }
  return out;
}

std::string DoctorJobName() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return absl::StrCat("dlcpctl-doctor-", host, "-", getpid());
}

// Why there is no host stage here, and what a worker does then.
Finding NoHostStage(const std::string& check, const absl::Status& why) {
  std::string fix = absl::IsUnavailable(why)
                        ? "run dlcpd with --host-socket on this host, and give the workers its directory (in "
                          "Kubernetes the node's /run/dlcp, deploy/k8s/examples/trainer) and DLCP_HOST_SOCKET"
                        : "what dlcpd's reason names (docs/host-stage.md, \"When there is no stage\")";
  return {Level::kWarn, check,
          absl::StrCat("no host stage: ", why.message(), ". The workers of a job on this host would each push ",
                       "their own data; fix: ", fix)};
}

}  // namespace

std::vector<Finding> CheckHost(const DoctorOptions& o) {
  std::vector<Finding> out;
  bool rdma = false;
  const fs::path ib = fs::path(o.sysfs) / "class/infiniband";
  std::error_code ec;
  std::vector<fs::path> devices;
  for (const auto& e : fs::directory_iterator(ib, ec)) devices.push_back(e.path());
  std::sort(devices.begin(), devices.end());
  for (const fs::path& dev : devices) {
    std::vector<fs::path> ports;
    for (const auto& p : fs::directory_iterator(dev / "ports", ec)) ports.push_back(p.path());
    std::sort(ports.begin(), ports.end());
    for (const fs::path& port : ports) rdma |= CheckPort(o, dev.filename().string(), port, &out);
  }
  if (devices.empty()) {
    out.push_back({Level::kWarn, "rdma",
                   "no RDMA device: dlcp runs over UDP (transport=auto). For RDMA, load the NIC's RDMA driver "
                   "(mlx5_ib), or for Soft-RoCE: rdma link add rxe0 type rxe netdev IFACE"});
  }
  out.push_back(CheckMemlock(o, rdma));
  for (Finding& f : CheckUdpBuffers(o)) out.push_back(std::move(f));
  out.push_back({Level::kOk, "dscp",
                 "advice: dlcp marks each priority class with its DSCP (46,34,18,0); the switches must map them "
                 "to strict-priority queues, and over RoCE the NIC must trust DSCP (mlnx_qos -i IFACE --trust "
                 "dscp; docs/rdma.md)"});
  return out;
}

std::vector<Finding> ProbeHostStage(const DoctorOptions& o) {
  if (o.host_socket.empty()) return {};
  const std::string check = absl::StrCat("host stage ", o.host_socket);
  StageJoinOptions join;
  join.socket_path = o.host_socket;
  join.hello.job_name = DoctorJobName();
  join.hello.world_size = 2;
  join.hello.local_size = 2;
  // Both ask before either waits: dlcpd forms the stage once every local worker has asked.
  std::vector<OwnedFd> asked;
  for (uint32_t rank : {0u, 1u}) {
    join.hello.rank = rank;
    absl::StatusOr<OwnedFd> fd = RequestHostStage(join);
    if (!fd.ok()) return {NoHostStage(check, fd.status())};
    asked.push_back(std::move(*fd));
  }
  const absl::Time deadline = MonotonicNow() + o.probe.rpc_timeout;
  std::vector<StageMembership> members;
  for (uint32_t rank : {0u, 1u}) {
    join.hello.rank = rank;
    absl::StatusOr<StageMembership> m = AwaitHostStage(asked[rank], join, deadline);
    if (!m.ok()) return {NoHostStage(check, m.status())};
    members.push_back(std::move(*m));
  }
  // One memory under both mappings: what rank 0 writes into its slot, rank 1 reads.
  const uint64_t mark = 0x74636f64'70636c64;  // "dlcpdoct"
  uint64_t seen = 0;
  std::memcpy(static_cast<char*>(members[0].region.data()) + kStageSlotsOffset, &mark, sizeof(mark));
  std::memcpy(&seen, static_cast<const char*>(members[1].region.data()) + kStageSlotsOffset, sizeof(seen));
  if (seen != mark) {
    return {{Level::kFail, check, "dlcpd handed the two workers regions that do not share their memory"}};
  }
  return {{Level::kOk, check,
           absl::StrFormat("dlcpd formed a stage of 2 workers and handed each its shared region (%.1f MiB, slots "
                           "of %.1f MiB), one memory in both: a job's workers on this host sum here and push once",
                           members[0].region.size() / 1048576.0, members[0].welcome.slot_bytes / 1048576.0)}};
}

std::vector<Finding> ProbeAggregators(const DoctorOptions& o) {
  std::vector<Finding> out;
  for (const std::string& a : o.aggregators) {
    ClientOptions c = o.probe;
    c.aggregators = {a};
    c.world_size = 1;
    c.rank = 0;
    c.job_name = DoctorJobName();
    c.on_aggregator_loss = ClientOptions::AggregatorLoss::kFail;
    const std::string name = absl::StrCat("aggregator ", a);
    const absl::Time start = absl::Now();
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(c);
    if (!client.ok()) {
      out.push_back({Level::kFail, name, absl::StrCat("control (Join): ", client.status().ToString())});
      continue;
    }
    const absl::Duration joined = absl::Now() - start;
    float one = 1;
    absl::StatusOr<RoundStats> r = (*client)->AllReduce(0, absl::MakeSpan(&one, 1)).get();
    const absl::Status left = (*client)->Close();
    if (!r.ok() || one != 1) {
      out.push_back({Level::kFail, name, absl::StrCat("joined, but no data round trip: ", r.status().ToString(),
                                                      " (is its data port reachable from here? a firewall?)")});
      continue;
    }
    out.push_back({left.ok() ? Level::kOk : Level::kWarn, name,
                   absl::StrFormat("control (Join) %.1f ms, data round trip over %s %.1f ms%s",
                                   absl::ToDoubleMilliseconds(joined),
                                   (*client)->transport_kind() == TransportOptions::Kind::kRdma ? "RDMA" : "UDP",
                                   absl::ToDoubleMilliseconds(r->time),
                                   left.ok() ? "" : absl::StrCat("; Leave: ", left.ToString()))});
  }
  return out;
}

std::string FormatFindings(const std::vector<Finding>& findings) {
  std::string out;
  for (const Finding& f : findings) {
    const char* level = f.level == Level::kOk ? "ok" : f.level == Level::kWarn ? "warn" : "FAIL";
    absl::StrAppendFormat(&out, "%-5s %s: %s\n", level, f.check, f.detail);
  }
  return out;
}

std::string FindingsJson(const std::vector<Finding>& findings) {
  std::string out = "[";
  for (size_t i = 0; i < findings.size(); ++i) {
    const Finding& f = findings[i];
    const char* level = f.level == Level::kOk ? "ok" : f.level == Level::kWarn ? "warn" : "fail";
    absl::StrAppend(&out, i ? "," : "", "{\"level\":\"", level, "\",\"check\":", Json(f.check),
                    ",\"detail\":", Json(f.detail), "}");
  }
  return out + "]";
}

bool AnyFailed(const std::vector<Finding>& findings) {
  return std::any_of(findings.begin(), findings.end(), [](const Finding& f) { return f.level == Level::kFail; });
}

}  // namespace dlcp::ctl
