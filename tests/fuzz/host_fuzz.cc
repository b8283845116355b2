// libFuzzer target for the messages of dlcpd's host socket (common/shm/host_hello.h), which come
// from any local process: a worker's hello (dlcpd reads it) and dlcpd's welcome (a worker reads
// it). The first byte picks which. Properties, beyond "no crash, no sanitizer report": what
// decodes meets the documented limits, and encodes back to the same bytes.
#include <cstdint>
#include <vector>

#include "common/shm/host_hello.h"
#include "common/shm/stage_layout.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const absl::Span<const uint8_t> bytes(data + 1, size - 1);
  if (data[0] % 2 == 0) {
    auto hello = dlcp::DecodeHostHello(bytes);
    if (!hello.ok()) return 0;
    if (hello->rank >= hello->world_size || hello->local_size < 2 || hello->local_size > dlcp::kMaxStageMembers ||
        hello->job_name.empty() || hello->job_name.size() > dlcp::kMaxHostJobName) {
      __builtin_trap();
    }
    if (dlcp::EncodeHostHello(*hello) != std::vector<uint8_t>(bytes.begin(), bytes.end())) __builtin_trap();
  } else {
    auto welcome = dlcp::DecodeHostWelcome(bytes);
    if (!welcome.ok()) return 0;
    if (welcome->code == absl::StatusCode::kOk &&
        (welcome->member >= welcome->ranks.size() || welcome->slot_bytes % 4096 != 0 || welcome->slot_bytes == 0)) {
      __builtin_trap();
    }
    if (dlcp::EncodeHostWelcome(*welcome) != std::vector<uint8_t>(bytes.begin(), bytes.end())) __builtin_trap();
  }
  return 0;
}
