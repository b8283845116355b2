// The messages of dlcpd's host socket (docs/host-stage.md), a Unix SOCK_SEQPACKET socket: a
// worker says which job and rank it is (Hello), and dlcpd answers once every local worker of that
// job has come, with its place in the job's host stage and the stage's shared region attached
// (Welcome), or with why there is none. The connection then stays open: its end is how dlcpd
// learns that the worker is gone.
//
// Explicit little-endian encoding, versioned; decoders check every field and length.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace dlcp {

inline constexpr uint16_t kHostHelloVersion = 2;
inline constexpr size_t kMaxHostMessageBytes = 4096;
inline constexpr size_t kMaxHostJobName = 128;

struct HostHello {
  std::string job_name;  // 1..kMaxHostJobName bytes
  uint32_t world_size = 0;
  uint32_t rank = 0;
  uint32_t local_size = 0;  // workers of the job on this host, this one included: 2..kMaxStageMembers
  // A worker whose stage lost a member asks for the next one on standby: it does not wait for the
  // answer, so its request has no deadline of its own; the gather's clock starts with the first
  // worker that does wait (the lost one, restarted). dlcpd sends standby workers their answer
  // before the others', so it is in their socket before anything the others do can reach them.
  bool standby = false;
};

struct HostWelcome {
  // OK: the attached descriptor is the stage's region. Otherwise no stage, and `reason` says why
  // (FAILED_PRECONDITION, RESOURCE_EXHAUSTED naming dlcpd's setting, DEADLINE_EXCEEDED, ...).
  absl::StatusCode code = absl::StatusCode::kOk;
  std::string reason;              // at most 1 KiB
  uint32_t member = 0;             // this worker's index in `ranks`
  std::vector<uint32_t> ranks;     // the stage's members' ranks, ascending
  uint64_t slot_bytes = 0;         // a multiple of 4096
};

std::vector<uint8_t> EncodeHostHello(const HostHello& hello);
// INVALID_ARGUMENT naming what is wrong (checked against the limits above, and rank < world).
absl::StatusOr<HostHello> DecodeHostHello(absl::Span<const uint8_t> bytes);
std::vector<uint8_t> EncodeHostWelcome(const HostWelcome& welcome);
absl::StatusOr<HostWelcome> DecodeHostWelcome(absl::Span<const uint8_t> bytes);

}  // namespace dlcp
