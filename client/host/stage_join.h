// Finding this host's stage of the job (docs/host-stage.md): asks the host's dlcpd over its Unix
// socket, waits for the answer that comes once every local worker of the job has asked, and maps
// the shared region it hands over.
//
// Threading: blocking, from one thread (Client::Connect).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/shm/descriptor_passing.h"
#include "common/shm/host_hello.h"
#include "common/shm/shared_region.h"

namespace dlcp {

struct StageJoinOptions {
  std::string socket_path;
  HostHello hello;
  absl::Duration timeout = absl::Seconds(60);  // dlcpd answers within its own gather timeout
};

// A worker's place in its host stage. The socket stays open for as long as the worker is in the
// stage: dlcpd takes its closing for the worker's end.
struct StageMembership {
  SharedRegion region;
  HostWelcome welcome;
  OwnedFd socket;
};

// The membership, or why there is none: UNAVAILABLE when no dlcpd serves the socket, dlcpd's own
// refusal (its reason), or what was wrong with its answer. The caller then takes the network path.
absl::StatusOr<StageMembership> JoinHostStage(const StageJoinOptions& options);

// JoinHostStage in two halves, for a worker that asks on standby (HostHello::standby) and goes on
// meanwhile: the connection its hello went out on, or UNAVAILABLE as above; then dlcpd's answer on
// it by `deadline`, or the errors above. `socket` stays open (and the request stands) only while
// no answer came: DEADLINE_EXCEEDED with `socket` still set.
absl::StatusOr<OwnedFd> RequestHostStage(const StageJoinOptions& options);
absl::StatusOr<StageMembership> AwaitHostStage(OwnedFd& socket, const StageJoinOptions& options, absl::Time deadline);

}  // namespace dlcp
