// Data keys on the worker's side (docs/security.md): the session hears of an aggregator's new
// keys in heartbeat answers (key rotation) and hands them here; the I/O thread switches to them
// between two turns of its loop, so no packet is signed or checked with a key half replaced.
// Pushes are signed with this worker's own key where the aggregator gave one (per-worker keys).
#include "client/transfer_engine.h"

namespace dlcp {

namespace {
// Orders an aggregator's key states: a newer generation, or the same one once the key before it
// is dropped.
uint32_t KeyVersion(uint32_t generation, bool has_previous) { return 2 * generation + (has_previous ? 0 : 1); }
}  // namespace

void TransferEngine::UpdateKeys(const std::string& aggregator_id, uint32_t generation, const wire::MacKey& newest,
                                std::optional<wire::MacKey> previous, std::optional<wire::MacKey> worker) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const uint32_t version = KeyVersion(generation, previous.has_value());
    shared_.key_updates.push_back(KeyUpdate{aggregator_id, version, newest, std::move(previous), std::move(worker)});
  }
  transport_->Wake();
}

void TransferEngine::ServeKeys() {
  std::vector<KeyUpdate> updates;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shared_.key_updates.empty()) return;
    updates.swap(shared_.key_updates);
  }
  for (KeyUpdate& u : updates) {
    auto known = latest_keys_.find(u.aggregator_id);
    if (known == latest_keys_.end() || known->second.version < u.version) latest_keys_[u.aggregator_id] = std::move(u);
  }
  ApplyLatestKeys();
}

void TransferEngine::ApplyLatestKeys() {
  // A layout (a regroup's) may have been taken from the session just before keys moved on: the
  // newest keys heard of win over older ones, whichever arrived last. BuildDestinations has sized
  // previous_keys and key_generations to the layout.
  for (size_t a = 0; a < options_.aggregator_ids.size() && a < options_.keys.size(); ++a) {
    auto latest = latest_keys_.find(options_.aggregator_ids[a]);
    // An aggregator that never gave a key does not check MACs: signing for it would not help.
    if (latest == latest_keys_.end() || !options_.keys[a].has_value()) continue;
    const KeyUpdate& u = latest->second;
    if (u.version <= KeyVersion(options_.key_generations[a], options_.previous_keys[a].has_value())) continue;
    options_.keys[a] = u.newest;
    options_.previous_keys[a] = u.previous;
    options_.worker_keys[a] = u.worker;
    options_.key_generations[a] = u.version / 2;
    const size_t end = a + 1 < routing_.dest_base.size() ? routing_.dest_base[a + 1] : flows_.size();
    for (size_t d = routing_.dest_base[a]; d < end; ++d) {
      flows_[d].key = &*options_.keys[a];
      flows_[d].prev_key = options_.previous_keys[a] ? &*options_.previous_keys[a] : nullptr;
      flows_[d].sign_key = SignKey(a);
    }
  }
}

const wire::MacKey* TransferEngine::SignKey(size_t a) const {
  if (!options_.keys[a].has_value()) return nullptr;
  return options_.worker_keys[a].has_value() ? &*options_.worker_keys[a] : &*options_.keys[a];
}

}  // namespace dlcp
