#include "server/jobs/roster.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dlcp::server {
namespace {

// The entries of `a` that `b` lacks, for saying what differs.
std::vector<std::string> Missing(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  std::vector<std::string> out;
  for (const std::string& x : a) {
    if (std::find(b.begin(), b.end(), x) == b.end()) out.push_back(x);
  }
  return out;
}

}  // namespace

absl::Status Roster::CheckAggregators(const std::string& job, uint32_t rank, const Joiner& joiner) {
  if (joiner.aggregators.empty()) return absl::OkStatus();
  if (aggregators_.empty()) {
    aggregators_ = joiner.aggregators;
    aggregators_rank_ = rank;
    return absl::OkStatus();
  }
  if (joiner.aggregators == aggregators_) return absl::OkStatus();
  const std::vector<std::string> only_here = Missing(joiner.aggregators, aggregators_);
  const std::vector<std::string> only_there = Missing(aggregators_, joiner.aggregators);
  std::string differs = only_here.empty() && only_there.empty() ? "the same aggregators in another order" : "";
  if (!only_here.empty()) absl::StrAppend(&differs, "only rank ", rank, " lists ", absl::StrJoin(only_here, ", "));
  if (!only_there.empty()) {
    absl::StrAppend(&differs, differs.empty() ? "" : "; ", "only rank ", aggregators_rank_, " lists ",
                    absl::StrJoin(only_there, ", "));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "job '", job, "': rank ", rank, " was given other aggregators than rank ", aggregators_rank_, " (", differs,
      "): every worker of a job must list the same aggregators in the same order"));
}

absl::Status Roster::Admit(const std::string& job, uint32_t rank, const Joiner& joiner,
                           const std::function<bool()>& holder_alive, const std::function<void()>& take) {
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = CheckAggregators(job, rank, joiner); !s.ok()) return s;
  Holder& h = holders_[rank];
  if (joiner.incarnation != 0 && h.incarnation != 0 && h.incarnation != joiner.incarnation && holder_alive()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job, "': rank ", rank, " is held by a live worker (", h.who, "; this one is ", joiner.who,
        "): each worker of a job needs its own rank. A restarted worker takes its rank back once the old one's "
        "heartbeats have lapsed (dlcpd --heartbeat-timeout-ms)"));
  }
  h = {joiner.incarnation, joiner.who, joiner.host};
  take();
  return absl::OkStatus();
}

absl::Status Roster::CheckHolder(const std::string& job, uint32_t rank, uint64_t incarnation) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Holder& h = holders_[rank];
  if (incarnation == 0 || h.incarnation == 0 || h.incarnation == incarnation) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("job '", job, "': rank ", rank,
                                                    " is now held by another worker (", h.who,
                                                    "): two workers were given the same rank"));
}

std::string Roster::HostOf(uint32_t rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  return rank < holders_.size() ? holders_[rank].host : "";
}

}  // namespace dlcp::server
