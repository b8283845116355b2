#include "server/jobs/regroup_barrier.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dlcp::server {

RegroupBarrier::~RegroupBarrier() {
  std::vector<std::pair<Reply, absl::StatusOr<RegroupOutcome>>> replies;
  {
    std::lock_guard<std::mutex> lock(mu_);
    replies = TakeAll(absl::AbortedError("the job ended at this aggregator during the regroup"));
  }
  for (auto& [r, value] : replies) r(std::move(value));
}

uint32_t RegroupBarrier::generation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return generation_;
}

std::vector<std::pair<RegroupBarrier::Reply, absl::StatusOr<RegroupOutcome>>> RegroupBarrier::TakeAll(
    const absl::StatusOr<RegroupOutcome>& r) {
  std::vector<std::pair<Reply, absl::StatusOr<RegroupOutcome>>> out;
  for (auto& [rank, w] : waiting_) out.emplace_back(std::move(w.reply), r);
  waiting_.clear();
  outcome_ = r;
  return out;
}

std::optional<std::string> RegroupBarrier::Arrive(RegroupArrival a, const std::function<uint32_t()>& new_epoch,
                                                  Reply reply) {
  std::vector<std::pair<Reply, absl::StatusOr<RegroupOutcome>>> replies;
  std::optional<std::string> failure;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (a.generation < generation_) {
      replies.emplace_back(std::move(reply), absl::FailedPreconditionError(absl::StrCat(
                                                 "regroup generation ", a.generation, " is over; this job is at ",
                                                 generation_)));
    } else {
      if (a.generation > generation_) {
        // Whatever still waits on an older generation can never complete now.
        replies = TakeAll(absl::AbortedError(absl::StrCat("superseded by regroup generation ", a.generation)));
        generation_ = a.generation;
        epoch_ = new_epoch();
        lost_ = a.lost;
        outcome_.reset();
      }
      if (a.lost != lost_) {
        const std::string why = absl::StrCat("workers disagree on the aggregators lost: rank ", a.rank, " names [",
                                             absl::StrJoin(a.lost, ", "), "], another worker [",
                                             absl::StrJoin(lost_, ", "), "]");
        failure = why;
        for (auto& r : TakeAll(absl::AbortedError(why))) replies.push_back(std::move(r));
        replies.emplace_back(std::move(reply), absl::AbortedError(why));
      } else if (!a.coordinate) {
        replies.emplace_back(std::move(reply), RegroupOutcome{epoch_, {}});
      } else if (outcome_.has_value()) {
        replies.emplace_back(std::move(reply), *outcome_);
      } else {
        waiting_[a.rank] = Waiting{std::move(a.done), a.deadline, a.carried, std::move(reply)};
        if (waiting_.size() == world_) {
          std::map<uint32_t, KeySpan> spans;
          for (const auto& [rank, w] : waiting_) {
            for (const auto& [key, done] : w.done) spans.try_emplace(key, KeySpan{key, UINT32_MAX, 0});
          }
          // A key a worker did not report, it has not finished a round of.
          for (auto& [key, span] : spans) {
            for (const auto& [rank, w] : waiting_) {
              if (w.carried) continue;
              uint32_t d = 0;
              for (const auto& [k, n] : w.done) {
                if (k == key) d = n;
              }
              span.min = std::min(span.min, d);
              span.max = std::max(span.max, d);
            }
          }
          absl::StatusOr<RegroupOutcome> result = RegroupOutcome{epoch_, {}};
          for (const auto& [key, span] : spans) {
            // A round finishes only once every worker pushed it, and a worker pushes a key's next
            // round only after its last one ended: so finished counts differ by one at most,
            // unless an op failed (and the trainer went on) somewhere.
            if (span.max > span.min + 1) {
              failure = absl::StrCat("key ", key, ": workers have finished between ", span.min, " and ", span.max,
                                     " rounds (an op failed and was not retried?); the job cannot regroup");
              result = absl::AbortedError(*failure);
              break;
            }
            result->spans.push_back(span);
          }
          replies = TakeAll(result);
        }
      }
    }
  }
  for (auto& [r, value] : replies) r(std::move(value));
  return failure;
}

std::optional<std::string> RegroupBarrier::Expire(absl::Time now) {
  std::vector<std::pair<Reply, absl::StatusOr<RegroupOutcome>>> replies;
  std::optional<std::string> failure;
  {
    std::lock_guard<std::mutex> lock(mu_);
    bool late = false;
    for (const auto& [rank, w] : waiting_) late |= now >= w.deadline;
    if (!late) return std::nullopt;
    std::vector<uint32_t> absent;
    for (uint32_t r = 0; r < world_; ++r) {
      if (!waiting_.count(r)) absent.push_back(r);
    }
    failure = absl::StrCat("regroup (lost: [", absl::StrJoin(lost_, ", "), "]) timed out waiting for rank",
                           absent.size() > 1 ? "s " : " ", absl::StrJoin(absent, ", "));
    replies = TakeAll(absl::DeadlineExceededError(*failure));
  }
  for (auto& [r, value] : replies) r(std::move(value));
  return failure;
}

}  // namespace dlcp::server
