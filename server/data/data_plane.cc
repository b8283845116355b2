#include "server/data/data_plane.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "server/data/data_thread.h"
#include "common/transport/factory.h"

namespace dlcp::server {
namespace {

// The RDMA port's own counters, one sample each, read at every scrape: what the NIC counted and
// no verbs call reports, such as mlx5's out_of_buffer (datagrams dropped for want of a posted
// receive buffer). Every data endpoint is on the same port, so one transport reads them.
void ExportPortCounters(const Transport* t, MetricsRegistry* metrics) {
  const PortCounterSource* port = t->port_counters();
  if (port == nullptr) return;
  absl::StatusOr<std::vector<PortCounter>> counters = port->ReadAll();
  if (!counters.ok()) {
    DLCP_LOG(Warning) << "no RDMA port counters to export: " << counters.status();
    return;
  }
  for (const PortCounter& c : *counters) {
    metrics->AddComputed("dlcp_rdma_port_counter_total", {{"counter", c.name}}, MetricsRegistry::Kind::kCounter,
                         "The RDMA port's own counters (sysfs hw_counters), e.g. mlx5 out_of_buffer: datagrams "
                         "dropped because a receive queue was empty",
                         [port, name = c.name] {
                           absl::StatusOr<uint64_t> v = port->Read(name);
                           return v.ok() ? static_cast<double>(*v) : std::numeric_limits<double>::quiet_NaN();
                         });
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<DataPlane>> DataPlane::Create(const DataPlaneOptions& options, JobRegistry* jobs,
                                                             MetricsRegistry* metrics) {
  if (options.threads == 0 || options.threads > 64) {
    return absl::InvalidArgumentError(absl::StrCat("data threads ", options.threads, " outside [1, 64]"));
  }
  std::unique_ptr<DataPlane> plane(new DataPlane());
  for (uint32_t i = 0; i < options.threads; ++i) {
    TransportOptions t = options.transport;
    if (t.port != 0) t.port = static_cast<uint16_t>(t.port + i);
    absl::StatusOr<std::unique_ptr<Transport>> transport = CreateTransport(t);
    if (!transport.ok()) {
      return absl::Status(transport.status().code(),
                          absl::StrCat("data endpoint ", i, ": ", transport.status().message()));
    }
    if (i > 0 && (*transport)->kind() != plane->kind_) {
      return absl::FailedPreconditionError(absl::StrCat("data endpoint ", i, " is ", TransportKindName((*transport)->kind()),
                                                        " but endpoint 0 is ", TransportKindName(plane->kind_)));
    }
    plane->kind_ = (*transport)->kind();
    plane->threads_.push_back(std::make_unique<DataThread>(i, std::move(*transport), options, jobs, metrics));
  }
  plane->rdma_qkey_ = plane->kind_ == TransportOptions::Kind::kRdma ? options.transport.rdma.qkey : 0;
  DataPlane* raw_plane = plane.get();
  // A counter summed over the data threads; `counter` picks it out of one thread's counters.
  auto transport_total = [raw_plane](auto counter) {
    return [raw_plane, counter] {
      double total = 0;
      for (const auto& t : raw_plane->threads_) total += counter(t->transport()->counters()).load();
      return total;
    };
  };
  auto transport_sum = [transport_total](std::atomic<uint64_t> TransportCounters::*field) {
    return transport_total([field](const TransportCounters& c) -> const std::atomic<uint64_t>& { return c.*field; });
  };
  using K = MetricsRegistry::Kind;
  metrics->AddComputed("dlcp_transport_packets_total", {{"direction", "rx"}}, K::kCounter,
                       "Datagrams the data sockets moved, valid or not", transport_sum(&TransportCounters::recv_packets));
  metrics->AddComputed("dlcp_transport_packets_total", {{"direction", "tx"}}, K::kCounter,
                       "Datagrams the data sockets moved, valid or not", transport_sum(&TransportCounters::sent_packets));
  metrics->AddComputed("dlcp_transport_bytes_total", {{"direction", "rx"}}, K::kCounter,
                       "Bytes the data sockets moved", transport_sum(&TransportCounters::recv_bytes));
  metrics->AddComputed("dlcp_transport_bytes_total", {{"direction", "tx"}}, K::kCounter,
                       "Bytes the data sockets moved", transport_sum(&TransportCounters::sent_bytes));
  metrics->AddComputed("dlcp_transport_dropped_total", {}, K::kCounter,
                       "Datagrams the transport knew it lost (truncated, unreachable peer)",
                       transport_sum(&TransportCounters::dropped));
  metrics->AddComputed("dlcp_transport_rx_overflows_total", {}, K::kCounter,
                       "Datagrams the kernel dropped because a data socket's receive buffer was full "
                       "(raise --socket-buffer-bytes, or net.core.rmem_max)",
                       transport_sum(&TransportCounters::rx_overflows));
  metrics->AddComputed("dlcp_transport_rx_queue_empty_total", {}, K::kCounter,
                       "Times an RDMA receive queue ran dry; the NIC drops what arrives then, uncounted "
                       "(raise --rdma-recv-slots, or add data threads)",
                       [raw_plane] {
                         double total = 0;
                         for (const auto& t : raw_plane->threads_) {
                           total += static_cast<double>(t->transport()->OwnCounter("rx_queue_empty"));
                         }
                         return total;
                       });
  // How datagrams are sprayed over paths: the source ports per endpoint, labelled with the burst
  // (datagrams per port choice, `auto` where it follows the datagram size; 1 would be per
  // packet), and how many bursts went out.
  const double ports = static_cast<double>(plane->threads_[0]->transport()->spray_sources().size() + 1);
  const uint32_t burst = options.transport.spray_burst;
  metrics->AddComputed("dlcp_transport_spray_ports", {{"burst", burst == 0 ? "auto" : absl::StrCat(burst)}}, K::kGauge,
                       "Source ports each data endpoint sprays its datagrams over (1: no spraying)",
                       [ports] { return ports; });
  metrics->AddComputed("dlcp_transport_spray_bursts_total", {}, K::kCounter,
                       "Bursts of datagrams sent from one spraying source port",
                       transport_sum(&TransportCounters::spray_bursts));
  // Which path each datagram took, per path index (summed over the data threads, whose source
  // ports differ but are chosen alike): how steering shared the results out.
  const size_t paths = std::min(plane->threads_[0]->transport()->send_paths(), TransportCounters::kMaxPaths);
  for (size_t p = 0; p < paths; ++p) {
    metrics->AddComputed("dlcp_transport_path_packets_total", {{"path", absl::StrCat(p)}}, K::kCounter,
                         "Datagrams sent on each send path (UDP source port, RDMA queue pair) by its index; "
                         "with spraying, how the traffic was shared over the fabric's paths",
                         transport_total([p](const TransportCounters& c) -> const std::atomic<uint64_t>& {
                           return c.path_packets[p];
                         }));
  }
  ExportPortCounters(plane->threads_[0]->transport(), metrics);
  for (auto& t : plane->threads_) plane->running_.emplace_back([raw = t.get()] { raw->Run(); });
  return plane;
}

DataPlane::~DataPlane() { Stop(); }

std::vector<Address> DataPlane::endpoints() const {
  std::vector<Address> out;
  for (const auto& t : threads_) out.push_back(t->transport()->local_address());
  return out;
}

std::map<std::string, std::string> DataPlane::where() const { return threads_.front()->transport()->where(); }

int DataPlane::family() const { return threads_.front()->transport()->local_address().family(); }

std::vector<std::vector<Address>> DataPlane::spray_sources() const {
  std::vector<std::vector<Address>> out;
  for (const auto& t : threads_) out.push_back(t->transport()->spray_sources());
  return out;
}

void DataPlane::Stop() {
  for (auto& t : threads_) t->Stop();
  for (auto& r : running_) {
    if (r.joinable()) r.join();
  }
  running_.clear();
}

}  // namespace dlcp::server
