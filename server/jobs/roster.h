// Who holds each rank of a job, and the aggregator list its first member gave: what each Join
// is checked against, so that a second process given a rank a live worker holds, or a worker
// given other aggregators than the rest of its job, is refused at once and named, rather than
// taken as a restart or left to run into its op deadline (docs/failure-modes.md).
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace dlcp::server {

// A joining worker as it describes itself. incarnation: random per client process, the same at
// every aggregator; 0 from a client that predates it, which is checked as before (a Join for a
// held rank is a restart). who: "host H pid P", for errors. aggregators: its list, each resolved
// to address:port, in its order; empty from an older client.
struct Joiner {
  uint64_t incarnation = 0;
  std::string who;
  std::string host;  // the host name it gave, or its address
  std::vector<std::string> aggregators;
};

// Thread-safe.
class Roster {
 public:
  explicit Roster(uint32_t world) : holders_(world) {}

  // Admits `joiner` to `rank` of job `job` and runs `take` (which seats it), both under one lock,
  // or refuses with FailedPrecondition: its aggregators differ from the job's, or another
  // incarnation holds the rank and `holder_alive()` (its heartbeats have not lapsed).
  absl::Status Admit(const std::string& job, uint32_t rank, const Joiner& joiner,
                     const std::function<bool()>& holder_alive, const std::function<void()>& take);
  // OK if `incarnation` (or a client without one) holds `rank`; FailedPrecondition naming the
  // holder otherwise: the caller was displaced by another process given the same rank.
  absl::Status CheckHolder(const std::string& job, uint32_t rank, uint64_t incarnation) const;
  // The host of `rank`'s holder (Joiner::host); empty before anyone took it.
  std::string HostOf(uint32_t rank) const;

 private:
  struct Holder {
    uint64_t incarnation = 0;
    std::string who;
    std::string host;
  };
  absl::Status CheckAggregators(const std::string& job, uint32_t rank, const Joiner& joiner);  // with mu_ held

  mutable std::mutex mu_;
  std::vector<Holder> holders_;
  std::vector<std::string> aggregators_;  // the first joiner's that gave one
  uint32_t aggregators_rank_ = 0;         // which rank gave them
};

}  // namespace dlcp::server
