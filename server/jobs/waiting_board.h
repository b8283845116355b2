// What a job's open rounds wait for at this aggregator: per key, the ranks that have not pushed
// any of the round yet. Data threads note it about once a second while a round waits; heartbeat
// answers carry what is fresh, so that a worker whose op runs into its deadline can name the
// ranks it waited for (docs/failure-modes.md). Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

namespace dlcp::server {

struct WaitingRound {
  uint32_t key = 0;
  uint32_t round = 0;
  std::vector<uint32_t> silent_ranks;  // ranks with no contribution to the round here
  int64_t waited_ns = 0;               // since the round opened
  int64_t noted_ns = 0;
};

class WaitingBoard {
 public:
  static constexpr size_t kMaxKeys = 16;  // what one heartbeat answer carries at most

  void Note(WaitingRound w) {
    std::lock_guard<std::mutex> lock(mu_);
    if (by_key_.size() >= kMaxKeys && !by_key_.count(w.key)) return;
    by_key_[w.key] = std::move(w);
  }
  // Notes newer than `max_age_ns` at `now_ns`; older ones are forgotten.
  std::vector<WaitingRound> Fresh(int64_t now_ns, int64_t max_age_ns) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<WaitingRound> out;
    for (auto it = by_key_.begin(); it != by_key_.end();) {
      if (now_ns - it->second.noted_ns > max_age_ns) {
        it = by_key_.erase(it);
        continue;
      }
      out.push_back(it->second);
      ++it;
    }
    return out;
  }

 private:
  std::mutex mu_;
  std::map<uint32_t, WaitingRound> by_key_;
};

}  // namespace dlcp::server
