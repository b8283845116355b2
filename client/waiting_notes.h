// What the aggregators last said their rounds of this job wait for (HeartbeatResponse.waiting):
// per aggregator, per key, the ranks that have pushed nothing of the round. An op that runs into
// its deadline names them (Client), so the error says which worker to look at. Also the job's
// slowest rank each aggregator names (HeartbeatResponse.slowest), which every op's RoundStats
// carries. Thread-safe: the heartbeat thread writes, any op's completion reads.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "dlcp/v1/control.pb.h"

namespace dlcp {

class WaitingNotes {
 public:
  // Replaces what aggregator `control` waits for with its latest heartbeat answer's.
  void Update(const std::string& control, const v1::HeartbeatResponse& resp) {
    std::lock_guard<std::mutex> lock(mu_);
    std::map<uint32_t, v1::WaitingRound>& mine = by_aggregator_[control];
    mine.clear();
    for (const v1::WaitingRound& w : resp.waiting()) mine[w.key()] = w;
    if (resp.has_slowest()) {
      slowest_[control] = resp.slowest();
    } else {
      slowest_.erase(control);
    }
  }
  // The rank the aggregators see latest (the greatest mean lateness any of them names), or
  // nullopt before any has named one.
  std::optional<v1::RankStats> Slowest() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::optional<v1::RankStats> out;
    for (const auto& [control, r] : slowest_) {
      if (!out || r.mean_lateness_us() > out->mean_lateness_us()) out = r;
    }
    return out;
  }
  // " Aggregator A's round R of key K had nothing from ranks 1, 2 after 3.0s." for each
  // aggregator waiting on `key`; empty when none is.
  std::string Describe(uint32_t key) const {
    std::lock_guard<std::mutex> lock(mu_);
    std::string out;
    for (const auto& [control, rounds] : by_aggregator_) {
      auto it = rounds.find(key);
      if (it == rounds.end() || it->second.silent_ranks().empty()) continue;
      const v1::WaitingRound& w = it->second;
      absl::StrAppend(&out, " Aggregator ", control, "'s round ", w.round(), " of key ", key, " had nothing from rank",
                      w.silent_ranks_size() == 1 ? " " : "s ", absl::StrJoin(w.silent_ranks(), ", "), " after ",
                      w.waited_ms() / 1000.0, "s.");
    }
    return out;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::map<uint32_t, v1::WaitingRound>> by_aggregator_;
  std::map<std::string, v1::RankStats> slowest_;
};

}  // namespace dlcp
