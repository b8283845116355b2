// The coordination behind the Regroup RPC (aggregator fail-over, docs/failure-modes.md), for one
// job at one aggregator. Thread-safe: gRPC callback threads call Arrive, dlcpd's housekeeping
// loop calls Expire. Replies run outside the lock, on whichever thread completes them.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dlcp::server {

struct KeySpan {
  uint32_t key = 0;
  uint32_t min = 0;  // rounds the slowest worker has finished
  uint32_t max = 0;  // ... and the fastest
  bool operator==(const KeySpan&) const = default;
};

struct RegroupArrival {
  uint32_t rank = 0;
  uint32_t generation = 0;
  std::vector<std::string> lost;  // sorted
  bool coordinate = false;
  std::vector<std::pair<uint32_t, uint32_t>> done;  // (key, rounds finished)
  absl::Time deadline;
  // Its data goes through its host stage's first rank (docs/host-stage.md), whose rounds count
  // for it: it runs none of its own for the keys of the stage.
  bool carried = false;
};

struct RegroupOutcome {
  uint32_t epoch = 0;
  std::vector<KeySpan> spans;  // coordinator only; sorted by key
};

class RegroupBarrier {
 public:
  using Reply = std::function<void(absl::StatusOr<RegroupOutcome>)>;
  explicit RegroupBarrier(uint32_t world) : world_(world) {}
  // A job that ends (every member left, or reaped) answers whoever still waits.
  ~RegroupBarrier();
  RegroupBarrier(const RegroupBarrier&) = delete;
  RegroupBarrier& operator=(const RegroupBarrier&) = delete;

  // The first arrival of a newer generation starts it: new_epoch() is called once, and every reply
  // of the generation carries its value. A plain arrival is answered at once; a coordinating one
  // once every rank has arrived (or at Expire). Returns a reason to fail the job when the workers
  // cannot agree (another set of lost aggregators, rounds more than one apart); every coordinating
  // arrival of the generation then gets that error.
  std::optional<std::string> Arrive(RegroupArrival a, const std::function<uint32_t()>& new_epoch, Reply reply);

  // Fails the coordinating arrivals whose deadline has passed; returns the reason (naming the
  // ranks that never came) when it did.
  std::optional<std::string> Expire(absl::Time now);

  uint32_t generation() const;

 private:
  struct Waiting {
    std::vector<std::pair<uint32_t, uint32_t>> done;
    absl::Time deadline;
    bool carried;
    Reply reply;
  };
  // With mu_ held: every waiting reply, paired with what it gets; clears the waiting set.
  std::vector<std::pair<Reply, absl::StatusOr<RegroupOutcome>>> TakeAll(const absl::StatusOr<RegroupOutcome>& r);

  const uint32_t world_;
  mutable std::mutex mu_;
  uint32_t generation_ = 0;
  uint32_t epoch_ = 0;
  std::vector<std::string> lost_;
  std::map<uint32_t, Waiting> waiting_;  // by rank
  // The coordination of this generation has ended; later coordinating arrivals get it again.
  std::optional<absl::StatusOr<RegroupOutcome>> outcome_;
};

}  // namespace dlcp::server
