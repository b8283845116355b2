#include "server/jobs/key_ring.h"

#include "common/base/check.h"
#include "common/base/clock.h"

namespace dlcp::server {

std::shared_ptr<const KeyRing::Generation> KeyRing::Generation::Make(const wire::MacKey& secret, uint32_t world,
                                                                    bool per_worker) {
  auto g = std::make_shared<Generation>();
  g->secret = secret;
  if (per_worker) {
    g->workers.reserve(world);
    g->results.reserve(world);
    for (uint32_t r = 0; r < world; ++r) {
      g->workers.push_back(wire::DeriveMacKey(secret, wire::KeyPurpose::kWorker, r));
      g->results.push_back(wire::DeriveMacKey(secret, wire::KeyPurpose::kResults, r));
    }
  }
  return g;
}

namespace {
const wire::MacKey* OfRank(const std::vector<wire::MacKey>& keys, const wire::MacKey& secret, uint32_t rank) {
  if (keys.empty()) return &secret;
  return rank < keys.size() ? &keys[rank] : nullptr;
}
}  // namespace

const wire::MacKey* KeyRing::Generation::worker(uint32_t rank) const { return OfRank(workers, secret, rank); }
const wire::MacKey* KeyRing::Generation::result(uint32_t rank) const { return OfRank(results, secret, rank); }

bool KeyRing::Keys::Verify(absl::Span<const uint8_t> datagram, size_t payload_len, uint32_t rank) const {
  const wire::MacKey* now = newest->worker(rank);
  if (now == nullptr) return false;
  return wire::VerifyMacEither(*now, previous ? previous->worker(rank) : nullptr, datagram, payload_len);
}

KeyRing::KeyRing(const wire::MacKey& first, uint32_t world, bool per_worker)
    : world_(world), per_worker_(per_worker), held_(world, 1), drawn_(MonotonicNow()) {
  Keys k;
  k.newest = Generation::Make(first, world, per_worker);
  history_.push_back(k);
  current_.store(&history_.back(), std::memory_order_release);
}

void KeyRing::Publish(Keys next) {
  history_.push_back(std::move(next));  // a deque never moves the elements it already holds
  current_.store(&history_.back(), std::memory_order_release);
}

absl::StatusOr<bool> KeyRing::Rotate(absl::Time now) {
  std::lock_guard<std::mutex> lock(mu_);
  const Keys& cur = history_.back();
  if (cur.previous) return false;
  absl::StatusOr<wire::MacKey> key = wire::NewMacKey();
  if (!key.ok()) return key.status();
  Keys next;
  next.generation = cur.generation + 1;
  next.newest = Generation::Make(*key, world_, per_worker_);
  next.previous = cur.newest;
  next.switched = false;
  drawn_ = now;
  Publish(std::move(next));
  return true;
}

void KeyRing::Holds(uint32_t rank, uint32_t generation) {
  std::lock_guard<std::mutex> lock(mu_);
  if (rank < held_.size()) held_[rank] = std::max(held_[rank], generation);
}

bool KeyRing::Advance(const std::vector<bool>& joined, absl::Time now, absl::Duration grace) {
  std::lock_guard<std::mutex> lock(mu_);
  const Keys& cur = history_.back();
  if (!cur.previous) return false;
  if (!cur.switched) {
    DLCP_CHECK_EQ(joined.size(), held_.size());
    for (size_t r = 0; r < held_.size(); ++r) {
      if (joined[r] && held_[r] < cur.generation) return false;
    }
    Keys next = cur;
    next.switched = true;
    switched_at_ = now;
    Publish(std::move(next));
    return true;
  }
  if (now - switched_at_ < grace) return false;
  Keys next = cur;
  next.previous.reset();
  Publish(std::move(next));
  return true;
}

absl::Time KeyRing::drawn() const {
  std::lock_guard<std::mutex> lock(mu_);
  return drawn_;
}

}  // namespace dlcp::server
