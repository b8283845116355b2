#include "server/data/data_plane.h"

#include "absl/strings/str_cat.h"
#include "server/data/data_thread.h"

namespace dlcp::server {

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
    plane->threads_.push_back(std::make_unique<DataThread>(i, std::move(*transport), options, jobs, metrics));
  }
  for (auto& t : plane->threads_) plane->running_.emplace_back([raw = t.get()] { raw->Run(); });
  return plane;
}

DataPlane::~DataPlane() { Stop(); }

std::vector<Address> DataPlane::endpoints() const {
  std::vector<Address> out;
  for (const auto& t : threads_) out.push_back(t->transport()->local_address());
  return out;
}

void DataPlane::AddTransportCounters(std::map<std::string, double>* out) const {
  double v[4] = {0, 0, 0, 0};
  for (const auto& t : threads_) {
    const TransportCounters& c = t->transport()->counters();
    v[0] += c.recv_packets.load();
    v[1] += c.recv_bytes.load();
    v[2] += c.sent_packets.load();
    v[3] += c.sent_bytes.load();
  }
  (*out)["dlcp_transport_recv_packets"] = v[0];
  (*out)["dlcp_transport_recv_bytes"] = v[1];
  (*out)["dlcp_transport_sent_packets"] = v[2];
  (*out)["dlcp_transport_sent_bytes"] = v[3];
}

void DataPlane::Stop() {
  for (auto& t : threads_) t->Stop();
  for (auto& r : running_) {
    if (r.joinable()) r.join();
  }
  running_.clear();
}

}  // namespace dlcp::server
