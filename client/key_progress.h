// Aggregator fail-over: how many rounds of a key a worker has finished (what each worker
// reports), or the slowest and the fastest worker have (the job's agreement).
#pragma once

#include <cstdint>

namespace dlcp {

struct KeyProgress {
  uint32_t key = 0;
  uint32_t done = 0;
  uint32_t done_max = 0;  // agreement only
};

}  // namespace dlcp
