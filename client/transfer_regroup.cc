// Aggregator fail-over on the data path (docs/failure-modes.md): the TransferEngine's side of a
// regroup. Client runs the handshake: PauseForRegroup, then Session::Regroup with the survivors,
// then Resume with their new epochs and the job's agreement on finished rounds.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/transfer_engine.h"
#include "common/base/clock.h"
#include "common/base/log.h"

namespace dlcp {

absl::StatusOr<std::vector<KeyProgress>> TransferEngine::PauseForRegroup(absl::Duration timeout) {
  if (!options_.retain_inputs) return absl::FailedPreconditionError("fail-over needs retain_inputs");
  std::unique_lock<std::mutex> lock(mu_);
  shared_.pause_requested = true;
  transport_->Wake();
  if (!regroup_cv_.wait_for(lock, absl::ToChronoMilliseconds(timeout),
                            [this] { return shared_.paused || shared_.stopped || !shared_.error.ok(); })) {
    return absl::DeadlineExceededError("the data path did not pause for the regroup");
  }
  if (!shared_.error.ok()) return shared_.error;
  if (shared_.stopped) return absl::CancelledError("dlcp client closed");
  return shared_.progress;
}

void TransferEngine::Resume(EngineLayout layout, std::vector<KeyProgress> agreed) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shared_.resume.emplace(std::move(layout), std::move(agreed));
  }
  transport_->Wake();
}

void TransferEngine::ServeRegroup(absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shared_.pause_requested && !shared_.paused) {
    // Rounds finished per key: one more than the last one completed here. Nothing completes
    // while paused, so the count holds until Resume.
    shared_.progress.clear();
    for (const auto& [key, round] : completed_round_) shared_.progress.push_back(KeyProgress{key, round + 1, 0});
    for (const auto& [key, op] : ops_) {
      if (!completed_round_.count(key)) shared_.progress.push_back(KeyProgress{key, 0, 0});
    }
    shared_.paused = true;
    regroup_cv_.notify_all();
  }
  if (shared_.resume.has_value() && shared_.paused) {
    auto [layout, agreed] = std::move(*shared_.resume);
    shared_.resume.reset();
    static_cast<EngineLayout&>(options_) = std::move(layout);
    BuildDestinations();
    for (auto& [key, op] : ops_) Restart(*op, now);
    for (auto& [key, op] : held_) Restart(*op, now);
    for (const KeyProgress& k : agreed) {
      auto done = completed_round_.find(k.key);
      const uint32_t mine = done == completed_round_.end() ? 0 : done->second + 1;
      if (!(k.done_max == k.done + 1 && mine == k.done_max)) continue;
      // This worker finished a round the slowest ones did not: they can only finish it with
      // this worker's input again, in the new layout. Its own next op of the key waits.
      auto last = last_done_.find(k.key);
      if (last == last_done_.end() || last->second->round + 1 != mine) {
        shared_.error = absl::InternalError(absl::StrCat("regroup: key ", k.key, " round ", mine - 1,
                                                  " must be pushed again, but its input was not kept"));
        break;
      }
      auto op = ops_.find(k.key);
      if (op != ops_.end()) {
        held_[k.key] = std::move(op->second);
        ops_.erase(op);
      }
      std::unique_ptr<Op> replay = ReplayOf(*last->second);
      Launch(*replay, now);
      DLCP_LOG(Warning) << "regroup: pushing key " << k.key << " round " << replay->round
                        << " again, for the workers that had not finished it";
      ops_[k.key] = std::move(replay);
    }
    shared_.pause_requested = shared_.paused = false;
  }
}

void TransferEngine::Rejoin(std::vector<uint32_t> epochs, bool rerun_all) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shared_.rejoin = std::move(epochs);
    shared_.rerun_all = rerun_all;
  }
  transport_->Wake();
}

void TransferEngine::ServeRejoin(absl::Time now) {
  std::vector<uint32_t> abandoned;
  std::vector<std::unique_ptr<Op>> rerun;  // shared_.rerun_all: every op under way, started ...
  std::deque<std::unique_ptr<Op>> rerun_unstarted;  // ... or not yet taken
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!shared_.rejoin.has_value()) return;
    if (shared_.rejoin->size() != options_.epochs.size()) {
      // The aggregators changed under it too (a regroup in between): no layout fits both.
      shared_.error = absl::AbortedError("the job went on after losing a worker while its aggregators changed; restart it");
      shared_.rejoin.reset();
      return;
    }
    options_.epochs = std::move(*shared_.rejoin);
    shared_.rejoin.reset();
    shared_.job_failed = absl::OkStatus();
    shared_.next_round.clear();
    BuildDestinations();
    completed_round_.clear();
    last_done_.clear();
    residuals_.clear();  // what earlier rounds left out belongs to the abandoned ones
    if (std::exchange(shared_.rerun_all, false)) {
      TakeEveryOp(&rerun, &rerun_unstarted);
    } else {
      RelaunchUnstarted(now, &abandoned);
    }
  }
  FailTaken(rerun, rerun_unstarted,
            absl::AbortedError("the job went on after losing a worker, through this host's stage formed again; "
                               "run the op again"));
  for (uint32_t key : abandoned) {
    Finish(key, absl::AbortedError(absl::StrCat("key ", key, ": the job went on without this op's round after "
                                                "losing a worker; run the op again")));
  }
}

void TransferEngine::RelaunchUnstarted(absl::Time now, std::vector<uint32_t>* abandoned) {
  for (auto& [key, op] : ops_) {
    // Nothing of it arrived (it was submitted after the loss, say): it is round 0 now.
    if (!op->retained.replay && op->remaining == op->geometry.chunk_count() && op->retained.left_out.empty()) {
      op->round = shared_.next_round[key]++;
      op->stats.round = op->round;
      Launch(*op, now);
    } else {
      abandoned->push_back(key);
    }
  }
  // Not taken yet: numbered in the old epoch's count, they start at round 0 of the new one too.
  for (auto& op : shared_.submitted) op->round = shared_.next_round[op->key]++;
}

void TransferEngine::TakeEveryOp(std::vector<std::unique_ptr<Op>>* started, std::deque<std::unique_ptr<Op>>* unstarted) {
  for (auto* ops : {&ops_, &held_}) {
    for (auto& [key, op] : *ops) started->push_back(std::move(op));
    ops->clear();
  }
  unstarted->swap(shared_.submitted);
  shared_.active_keys.clear();
}

void TransferEngine::Restart(Op& op, absl::Time now) {
  // A gated op's parts not kept yet were not pushed either: no result came into them.
  if (op.retained.input.size() == op.geometry.tensor_elems) {
    std::memcpy(op.data, op.retained.input.data(), op.retained.kept * sizeof(float));
  }
  // Contributions the old layout left out went into the residual; this attempt decides afresh.
  if (!op.retained.left_out.empty()) {
    Residual& r = ResidualOf(op);
    for (uint32_t c : op.retained.left_out) {
      float* keep = r.values.data() + op.geometry.offset(c);
      const float* in = op.retained.input.data() + op.geometry.offset(c);
      for (uint32_t i = 0; i < op.geometry.elems(c); ++i) keep[i] -= in[i];
    }
    op.retained.left_out.clear();
  }
  op.stats.left_out_by_class = {};
  op.stats.droppable_total = op.stats.droppable_missing = 0;
  op.stats.bound_violations = 0;
  op.stats.pull_missing = 0;
  op.clock.pushed_once = 0;
  TraceMoment(op, "restart", now);
  Launch(op, now);
}

std::unique_ptr<TransferEngine::Op> TransferEngine::ReplayOf(const Op& finished) {
  auto op = std::make_unique<Op>();
  op->key = finished.key;
  op->round = finished.round;
  op->geometry = finished.geometry;
  op->chunks.classes = finished.chunks.classes;
  op->encoding = finished.encoding;
  op->packets = finished.packets;
  op->packet_stride = finished.packet_stride;
  op->tensor = finished.tensor;
  op->loss_bound_ppm = finished.loss_bound_ppm;
  op->broadcast_root = finished.broadcast_root;
  op->carries = finished.carries;  // a host stage's sum counts for its ranks again, or the round waits on them
  op->bounded.pull_ppm = finished.bounded.pull_ppm;
  op->bounded.droppable_chunks = finished.bounded.droppable_chunks;
  op->stats.key = finished.key;
  op->stats.round = finished.round;
  op->stats.chunks_by_class = finished.stats.chunks_by_class;
  op->retained.input = finished.retained.input;
  op->retained.kept = finished.retained.kept;
  op->retained.scratch = finished.retained.input;
  op->data = op->retained.scratch.data();
  op->retained.replay = true;
  op->done = [](absl::StatusOr<RoundStats>) {};
  return op;
}

void TransferEngine::FinishReplay(std::unique_ptr<Op> replay, const absl::Status& status) {
  if (!status.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    if (shared_.error.ok()) {
      shared_.error = absl::Status(status.code(), absl::StrCat("pushing key ", replay->key, " round ", replay->round,
                                                        " again after the regroup: ", status.message()));
    }
    return;
  }
  auto held = held_.find(replay->key);
  if (held == held_.end()) return;
  std::unique_ptr<Op> op = std::move(held->second);
  held_.erase(held);
  Launch(*op, MonotonicNow());
  ops_[op->key] = std::move(op);
}

}  // namespace dlcp
