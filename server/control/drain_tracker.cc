#include "server/control/drain_tracker.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/clock.h"

namespace dlcp::server {

void DrainTracker::Told(uint32_t job_id, uint32_t rank) {
  std::lock_guard<std::mutex> lock(mu_);
  told_.insert(Id(job_id, rank));
  let_go_.erase(Id(job_id, rank));  // it beats here again, so it holds on after all
  last_told_ns_.store(MonotonicNanos(), std::memory_order_release);
}

void DrainTracker::LetGo(uint32_t job_id, uint32_t rank) {
  std::lock_guard<std::mutex> lock(mu_);
  let_go_.insert(Id(job_id, rank));
}

std::vector<std::string> DrainTracker::Untold(const JobRegistry& jobs) const {
  std::lock_guard<std::mutex> lock(mu_);
  return Joined(jobs, told_);
}

std::vector<std::string> DrainTracker::Holding(const JobRegistry& jobs) const {
  std::lock_guard<std::mutex> lock(mu_);
  return Joined(jobs, let_go_);
}

std::vector<std::string> DrainTracker::Joined(const JobRegistry& jobs, const absl::flat_hash_set<uint64_t>& done) const {
  std::vector<std::string> out;
  if (!active()) return out;
  for (const std::shared_ptr<Job>& job : jobs.List()) {
    if (job->closed.load()) continue;
    for (uint32_t r = 0; r < job->world; ++r) {
      if (job->members[r].joined() && !done.contains(Id(job->id, r))) {
        out.push_back(absl::StrCat("job '", job->name, "' rank ", r));
      }
    }
  }
  std::sort(out.begin(), out.end());  // jobs come in hash order; logs and tests read better sorted
  return out;
}

}  // namespace dlcp::server
