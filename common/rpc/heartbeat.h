// How often a worker beats, which both sides need: the client to beat, and dlcpd to know how
// long a worker that put off moving off a draining aggregator may take to ask again.
#pragma once

#include <algorithm>

#include "absl/time/time.h"

namespace dlcp {

// ClientOptions::heartbeat_interval unless set otherwise.
inline constexpr absl::Duration kDefaultHeartbeatInterval = absl::Seconds(1);

// The interval a worker beats at: as asked, and at least three times per deadline the aggregator
// announced at Join, so one lost or late heartbeat is not fatal.
inline absl::Duration HeartbeatInterval(absl::Duration requested, absl::Duration deadline) {
  return std::min(requested, deadline / 3);
}

}  // namespace dlcp
