// Workers and aggregators tell each other their data-plane wire format (the header's version
// byte) when a worker joins. A peer of another format would see every datagram of the job refused
// as kBadVersion and the rounds time out; checking at join turns that into one clear error.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dlcp::wire {

// The format a peer announced at join; 0 means it predates announcing one, and speaks version 1.
inline constexpr uint32_t AnnouncedWireVersion(uint32_t announced) { return announced == 0 ? 1 : announced; }

// OK when `announced` is this build's kVersion. Otherwise FailedPrecondition naming both formats
// and both releases: `peer` is who announced it ("the worker", "aggregator host:port"), `self`
// who checks ("this aggregator", "this client"); `peer_release` may be empty (unknown).
absl::Status CheckPeerWireVersion(uint32_t announced, absl::string_view peer_release, absl::string_view peer,
                                  absl::string_view self);

}  // namespace dlcp::wire
