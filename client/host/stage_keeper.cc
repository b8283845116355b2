#include "client/host/stage_keeper.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/clock.h"
#include "common/base/log.h"

namespace dlcp {

StageKeeper::StageKeeper(StageMembership first, StageJoinOptions join, MakeStage make, Broken lost)
    : join_(std::move(join)), make_(std::move(make)), lost_hook_(std::move(lost)), ranks_(first.welcome.ranks) {
  std::lock_guard<std::mutex> lock(mu_);
  Make(std::move(first));
}

std::shared_ptr<HostStage> StageKeeper::Current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stopped_ ? nullptr : current_;
}

void StageKeeper::FailJob(const absl::Status& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (current_ != nullptr && !stopped_) current_->FailJob(why);
}

bool StageKeeper::RejoinJob() {
  std::shared_ptr<HostStage> replaced;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return false;
    if (current_ != nullptr) {
      current_->RejoinJob();
      return false;
    }
    if (!TakeAnswer()) return false;
    replaced = std::move(lost_);
  }
  Retire(std::move(replaced));
  return true;
}

void StageKeeper::Retire(std::shared_ptr<HostStage> stage) {
  if (stage == nullptr) return;
  stage->Stop(absl::AbortedError("this host's stage formed again"));
  // Its memory goes with it, unless a network leg of it is still an op of the engine, which writes
  // into that memory until it ends: then it stays until the client closes, after the engine.
  if (stage->LegsInFlight()) {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_.push_back(std::move(stage));
  }
}

void StageKeeper::Stop(const absl::Status& why) {
  std::shared_ptr<HostStage> current, lost;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    current = current_;
    lost = lost_;
    standby_ = OwnedFd();  // dlcpd forgets the request
  }
  // Stopped, not dropped: the engine may write into their memory until it stops too (Client::Close).
  if (current != nullptr) current->Stop(why);
  if (lost != nullptr) lost->Stop(why);
}

void StageKeeper::Make(StageMembership m) {
  const uint64_t generation = ++generation_;
  current_ = make_(std::move(m), [this, generation](const absl::Status& why) { Lose(generation, why); });
}

void StageKeeper::Lose(uint64_t generation, const absl::Status& why) {
  std::shared_ptr<HostStage> older;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_ || generation != generation_ || current_ == nullptr) return;
    older = std::exchange(lost_, std::move(current_));
  }
  Retire(std::move(older));
  StageJoinOptions standby = join_;
  standby.hello.standby = true;
  absl::StatusOr<OwnedFd> request = RequestHostStage(standby);
  if (request.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopped_) standby_ = std::move(*request);
  } else {
    DLCP_LOG(Warning) << "rank " << join_.hello.rank << " of job '" << join_.hello.job_name
                      << "': cannot ask dlcpd for its host stage again, so it pushes its own data from now on: "
                      << request.status().message();
  }
  lost_hook_(why);
}

bool StageKeeper::TakeAnswer() {
  if (standby_.get() < 0) return false;
  // No wait: dlcpd answered the standby request before the lost rank could join the job, and the
  // job goes on only once it has. No answer means that rank came back without this stage.
  absl::StatusOr<StageMembership> m = AwaitHostStage(standby_, join_, MonotonicNow());
  const std::string who = absl::StrCat("rank ", join_.hello.rank, " of job '", join_.hello.job_name, "'");
  if (!m.ok()) {
    if (standby_.get() >= 0) {  // unanswered: it stands, should the rank be lost and come back again
      DLCP_LOG(Warning) << who << ": its host stage did not form again (the lost rank came back without it); "
                        << "this worker pushes its own data";
    } else {
      DLCP_LOG(Warning) << who << ": its host stage does not form again, so it pushes its own data from now on: "
                        << m.status().message();
    }
    return false;
  }
  if (m->welcome.ranks != ranks_) {  // the aggregators know this host's group as it joined
    DLCP_LOG(Warning) << who << ": its host stage formed again with ranks " << absl::StrJoin(m->welcome.ranks, ",")
                      << ", not " << absl::StrJoin(ranks_, ",") << " as the job knows it; this worker pushes its own data";
    return false;
  }
  DLCP_LOG(Info) << who << ": host stage formed again with ranks " << absl::StrJoin(m->welcome.ranks, ",");
  Make(std::move(*m));
  return true;
}

}  // namespace dlcp
