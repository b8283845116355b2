#include "common/transport/loopback/loopback_transport.h"
#include "common/transport/factory.h"
#include "common/transport/transport.h"
#include "common/transport/udp/udp_transport.h"

#include <mutex>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/build_config.h"
#include "common/base/log.h"
#if DLCP_WITH_RDMA
#include "common/transport/rdma/rdma_transport.h"
#endif

namespace dlcp {

absl::StatusOr<TransportOptions::Kind> ParseTransportKind(const std::string& name) {
  if (name == "auto") return TransportOptions::Kind::kAuto;
  if (name == "udp") return TransportOptions::Kind::kUdp;
  if (name == "rdma") return TransportOptions::Kind::kRdma;
  if (name == "loopback") return TransportOptions::Kind::kLoopback;
  return absl::InvalidArgumentError(absl::StrCat("unknown transport '", name, "' (auto|udp|rdma|loopback)"));
}

absl::Status ParseDscpMap(const std::string& text, std::array<uint8_t, 4>* out) {
  std::vector<std::string> parts = absl::StrSplit(text, ',');
  if (parts.size() != 4) return absl::InvalidArgumentError("expected 4 comma-separated DSCP values, one per class");
  for (size_t i = 0; i < 4; ++i) {
    int v = 0;
    if (!absl::SimpleAtoi(parts[i], &v) || v < 0 || v > 63) {
      return absl::InvalidArgumentError(absl::StrCat("DSCP '", parts[i], "' is not in [0, 63]"));
    }
    (*out)[i] = static_cast<uint8_t>(v);
  }
  return absl::OkStatus();
}

const char* TransportKindName(TransportOptions::Kind kind) {
  switch (kind) {
    case TransportOptions::Kind::kAuto:
      return "auto";
    case TransportOptions::Kind::kUdp:
      return "udp";
    case TransportOptions::Kind::kRdma:
      return "rdma";
    case TransportOptions::Kind::kLoopback:
      return "loopback";
  }
  return "?";
}

namespace {
absl::StatusOr<std::unique_ptr<Transport>> CreateRdma(const TransportOptions& options) {
#if DLCP_WITH_RDMA
  return CreateRdmaTransport(options);
#else
  return absl::UnimplementedError("this build has no RDMA transport (configure with -DDLCP_WITH_RDMA=ON and "
                                  "libibverbs-dev installed)");
#endif
}
}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> CreateTransport(const TransportOptions& options) {
  if (options.max_datagram < 64 || options.max_datagram > 65507) {
    return absl::InvalidArgumentError(absl::StrCat("max_datagram ", options.max_datagram, " outside [64, 65507]"));
  }
  if (options.recv_batch == 0 || options.recv_batch > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("recv_batch ", options.recv_batch, " outside [1, 1024]"));
  }
  if (options.spray_ports == 0 || options.spray_ports > 64 || options.spray_burst > 64) {
    return absl::InvalidArgumentError(absl::StrCat("spray_ports ", options.spray_ports,
                                                   " must be in [1, 64] and spray_burst ", options.spray_burst,
                                                   " in [0, 64] (0: by datagram size)"));
  }
  for (uint8_t d : options.dscp) {
    if (d > 63) return absl::InvalidArgumentError(absl::StrCat("DSCP ", d, " outside [0, 63]"));
  }
  switch (options.kind) {
    case TransportOptions::Kind::kUdp:
      return CreateUdpTransport(options);
    case TransportOptions::Kind::kLoopback:
      return CreateLoopbackTransport(options);
    case TransportOptions::Kind::kRdma:
      return CreateRdma(options);
    case TransportOptions::Kind::kAuto: {
      absl::StatusOr<std::unique_ptr<Transport>> rdma = CreateRdma(options);
      if (rdma.ok()) return rdma;
      // Logged once per process: every endpoint would say the same.
      static std::once_flag logged;
      std::call_once(logged, [&] { DLCP_LOG(Info) << "transport auto: using UDP, because " << rdma.status().message(); });
      return CreateUdpTransport(options);
    }
  }
  return absl::InvalidArgumentError("unknown transport kind");
}

}  // namespace dlcp
