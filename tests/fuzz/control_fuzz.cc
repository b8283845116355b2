// libFuzzer target for the control-plane request handlers: the first byte picks the handler
// (Join, Leave, Heartbeat, GetTopology, GetStats, Regroup, RotateDataKey) and the peer string, the
// rest is the request as protobuf bytes. The handlers run against a real JobRegistry and data plane (loopback
// transport). Properties, beyond "no crash, no sanitizer report": every job's member count equals
// its joined members, limits hold, a refused Join changes nothing, a Regroup is answered
// exactly once (at once, or when its deadline passes), and a heartbeat answer carries whole keys
// while data keys rotate all the time.
#include <cstdint>
#include <memory>
#include <string>

#include <google/protobuf/stubs/logging.h>

#include "common/base/clock.h"
#include "common/base/log.h"
#include "common/metrics/registry.h"
#include "server/control/aggregator_service.h"
#include "server/data/data_plane.h"
#include "server/jobs/job_registry.h"
#include "common/transport/transport_options.h"

namespace {

using dlcp::server::AggregatorService;
using dlcp::server::JobRegistry;

struct World {
  World() {
    // Invalid UTF-8 in string fields is refused by protobuf, which logs each time: noise here.
    google::protobuf::SetLogHandler(nullptr);
    dlcp::LogOptions log;
    log.min_level = dlcp::LogLevel::kError;
    dlcp::ConfigureLogging(log);
    dlcp::server::JobLimits limits;
    limits.max_jobs = 4;
    limits.max_workers = 16;
    // Every TendKeys starts or moves on a key rotation, so heartbeats meet every phase.
    limits.data_key_rotation = absl::Nanoseconds(1);
    limits.data_key_grace = absl::ZeroDuration();
    jobs = new JobRegistry(limits);
    dlcp::server::DataPlaneOptions d;
    d.transport.kind = dlcp::TransportOptions::Kind::kLoopback;
    plane = dlcp::server::DataPlane::Create(d, jobs, &metrics)->release();
    service = new AggregatorService("fuzz", "", jobs, plane, &metrics);
  }
  dlcp::MetricsRegistry metrics;
  JobRegistry* jobs;
  dlcp::server::DataPlane* plane;
  AggregatorService* service;
};

void CheckInvariants(const JobRegistry& jobs) {
  auto all = jobs.List();
  if (all.size() > jobs.limits().max_jobs) __builtin_trap();
  for (const auto& job : all) {
    uint32_t joined = 0;
    for (const auto& m : job->members) joined += m.joined() ? 1 : 0;
    if (joined != job->member_count.load() || job->world > jobs.limits().max_workers) __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static World* w = new World();
  if (size < 1) return 0;
  static const char* kPeers[] = {"ipv4:127.0.0.1:5000", "ipv6:[::1]:5000", "", "ipv4:", "unix:/x"};
  const std::string peer = kPeers[(data[0] >> 4) % 5];
  const char* body = reinterpret_cast<const char*>(data + 1);
  const int len = static_cast<int>(size - 1);
  switch (data[0] % 7) {
    case 0: {
      dlcp::v1::JoinRequest req;
      dlcp::v1::JoinResponse resp;
      if (!req.ParseFromArray(body, len)) return 0;
      // Mostly a client that takes per-worker keys, so joins get far; with bit 3 set, as parsed.
      if (!(data[0] & 8)) req.set_worker_keys(true);
      const size_t jobs_before = w->jobs->List().size();
      absl::Status s = w->service->HandleJoin(peer, req, &resp);
      if (s.ok() && !req.worker_keys()) __builtin_trap();  // it would sign with the shared key
      if (!s.ok() && w->jobs->List().size() > jobs_before) __builtin_trap();  // a refusal left a job behind
      // A joiner gets the job's key and one of its own rank (per-worker keys), never the other's.
      if (s.ok() && (resp.data_endpoints_size() != 1 || resp.data_key().size() != 32 || resp.worker_key().size() != 32 ||
                     resp.worker_key() == resp.data_key())) {
        __builtin_trap();
      }
      break;
    }
    case 1: {
      dlcp::v1::LeaveRequest req;
      if (!req.ParseFromArray(body, len)) return 0;
      w->service->HandleLeave(req).IgnoreError();
      break;
    }
    case 2: {
      dlcp::v1::HeartbeatRequest req;
      dlcp::v1::HeartbeatResponse resp;
      if (!req.ParseFromArray(body, len)) return 0;
      const bool ok = w->service->HandleHeartbeat(req, &resp).ok();
      // A member always learns the job's keys: the newest, its own, and the one before only whole.
      if (ok && (resp.data_key().size() != 32 || resp.data_key_generation() == 0 || resp.worker_key().size() != 32 ||
                 (!resp.previous_data_key().empty() && resp.previous_data_key().size() != 32))) {
        __builtin_trap();
      }
      for (const std::string& line : w->jobs->TendKeys(dlcp::MonotonicNow())) (void)line;
      break;
    }
    case 3: {
      dlcp::v1::GetTopologyRequest req;
      dlcp::v1::Topology resp;
      if (!req.ParseFromArray(body, len)) return 0;
      w->service->HandleGetTopology(req, &resp).IgnoreError();
      break;
    }
    case 4: {
      dlcp::v1::RegroupRequest req;
      if (!req.ParseFromArray(body, len)) return 0;
      // A coordinating arrival answers later: the response lives until its answer.
      auto* resp = new dlcp::v1::RegroupResponse();
      auto answers = std::make_shared<int>(0);
      absl::Status s = w->service->HandleRegroup(req, resp, [resp, answers](absl::Status) {
        if (++*answers > 1) __builtin_trap();
        delete resp;
      });
      if (!s.ok()) {
        if (*answers != 0) __builtin_trap();  // refused, yet answered too
        delete resp;
      }
      // Whatever still waits has passed its deadline by then.
      for (const std::string& line : w->jobs->ExpireRegroups(dlcp::MonotonicNow() + absl::Minutes(3))) (void)line;
      break;
    }
    case 5: {
      dlcp::v1::RotateDataKeyRequest req;
      dlcp::v1::RotateDataKeyResponse resp;
      if (!req.ParseFromArray(body, len)) return 0;
      const bool ok = w->service->HandleRotateDataKey(req, &resp).ok();
      if (ok && resp.data_key_generation() < 2 && resp.started()) __builtin_trap();  // a new key is 2 or later
      break;
    }
    default: {
      dlcp::v1::GetStatsRequest req;
      dlcp::v1::Stats resp;
      if (!req.ParseFromArray(body, len)) return 0;
      if (!w->service->HandleGetStats(req, &resp).ok()) __builtin_trap();
      break;
    }
  }
  CheckInvariants(*w->jobs);
  return 0;
}
