// Key rotation on the worker's side (docs/security.md): the session hears of an aggregator's new
// data keys in heartbeat answers and hands them here; the I/O thread switches to them between
// two turns of its loop, so no packet is signed or checked with a key half replaced.
#include "client/transfer_engine.h"

namespace dlcp {

void TransferEngine::UpdateKeys(const std::string& aggregator_id, const wire::MacKey& newest,
                                std::optional<wire::MacKey> previous) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    key_updates_.push_back(KeyUpdate{aggregator_id, newest, std::move(previous)});
  }
  transport_->Wake();
}

void TransferEngine::ServeKeys() {
  std::vector<KeyUpdate> updates;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (key_updates_.empty()) return;
    updates.swap(key_updates_);
  }
  for (KeyUpdate& u : updates) {
    for (size_t a = 0; a < options_.aggregator_ids.size() && a < options_.keys.size(); ++a) {
      // An aggregator that never gave a key does not check MACs: signing for it would not help.
      if (options_.aggregator_ids[a] != u.aggregator_id || !options_.keys[a].has_value()) continue;
      options_.keys[a] = u.newest;
      options_.previous_keys[a] = u.previous;
      const size_t end = a + 1 < dest_base_.size() ? dest_base_[a + 1] : dest_addr_.size();
      for (size_t d = dest_base_[a]; d < end; ++d) {
        dest_key_[d] = &*options_.keys[a];
        dest_prev_key_[d] = options_.previous_keys[a] ? &*options_.previous_keys[a] : nullptr;
      }
    }
  }
}

}  // namespace dlcp
