// A control service ("agg-a") over a loopback data plane, for tests that drive its handlers
// directly, and the Join request its tests send.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "common/metrics/registry.h"
#include "common/transport/transport_options.h"
#include "server/control/aggregator_service.h"
#include "server/data/data_plane.h"
#include "server/jobs/job_registry.h"

namespace dlcp::server {

class ControlServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DataPlaneOptions d;
    d.transport.kind = TransportOptions::Kind::kLoopback;
    auto plane = DataPlane::Create(d, &jobs_, &metrics_);
    ASSERT_TRUE(plane.ok()) << plane.status();
    data_ = std::move(*plane);
    service_ = std::make_unique<AggregatorService>("agg-a", "", &jobs_, data_.get(), &metrics_);
  }
  void TearDown() override { data_->Stop(); }

  // Rank `rank` of a job of `world` joining: 1 KiB chunks, data port 5000 + rank.
  static v1::JoinRequest JoinRequestFor(const std::string& job, uint32_t world, uint32_t rank) {
    v1::JoinRequest req;
    req.set_job_name(job);
    req.set_world_size(world);
    req.set_rank(rank);
    req.set_chunk_bytes(1024);
    req.set_data_port(5000 + rank);
    req.set_worker_keys(true);
    return req;
  }

  MetricsRegistry metrics_;
  JobRegistry jobs_{JobLimits{}};
  std::unique_ptr<DataPlane> data_;
  std::unique_ptr<AggregatorService> service_;
};

}  // namespace dlcp::server
