// The bounded-loss half of DataThread: manifests, the tail timer, sealing and STOP, and repairs
// limited to what the bound requires. See docs/bounded-loss.md.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/check.h"
#include "common/base/log.h"
#include "common/datapath/quiet_spell.h"
#include "common/wire/bounded.h"
#include "server/data/data_thread.h"

namespace dlcp::server {

void DataThread::HandleManifest(const wire::Header& h, const uint8_t* payload, Round* round, absl::Time now) {
  if (round->sealed()) {  // the worker missed the STOP
    metrics_.stops_resent->Add();
    return SendStop(*round, h.rank);
  }
  // A manifest whose `contributors` is 2 or more declares the classes of a host stage's sum, for
  // every rank of the stage's group (docs/host-stage.md), as its pushes carry them all.
  const Job& job = *round->job();
  std::shared_ptr<const std::vector<uint32_t>> group;
  if (h.contributors > 1) {
    group = job.HostGroupLedBy(h.rank);
    if (group == nullptr || group->size() != h.contributors) return Reject(wire::Reject::kBadHostGroup);
  }
  if (round->Carried(h.rank)) return Reject(wire::Reject::kBadHostGroup);  // its stage declared for it
  absl::StatusOr<wire::ManifestPart> part =
      wire::DecodeManifest(absl::MakeConstSpan(payload, h.payload_len), round->geometry().chunk_count());
  if (!part.ok()) return Reject(wire::Reject::kBadPayload);
  if (group != nullptr) round->CarryGroup(group);
  for (uint32_t rank : group ? *group : std::vector<uint32_t>{h.rank}) {
    if (absl::Status s = round->EnableBounded().AddManifest(rank, *part); !s.ok()) {
      DLCP_LOG(Warning) << "job " << job.name << " rank " << rank << " key " << h.key << ": " << s;
      return Reject(wire::Reject::kBadPayload);
    }
  }
  CheckBound(round, now);
}

absl::Time DataThread::TailEnd(const Round& r) const {
  return QuietSpellEnd(r.created(), r.last_progress(), r.contributions(), kTailGaps, kMinTail, options_.repair_timeout);
}

void DataThread::CheckBound(Round* round, absl::Time now) {
  const LossTracker& t = *round->bounded;
  if (round->sealed()) return;
  if (t.AllIn()) return Seal(round, now);
  if (round->tail.armed || !t.BoundMet()) return;
  round->tail.armed = true;
  round->tail.armed_at = now;
  armed_.push_back(RoundKey{round->job()->id, round->epoch(), round->key(), round->round()});
  next_tail_ = std::min(next_tail_, TailEnd(*round));
}

absl::Time DataThread::FireTails(absl::Time now) {
  absl::Time next = absl::InfiniteFuture();
  for (size_t i = 0; i < armed_.size();) {
    auto it = rounds_.find(armed_[i]);
    Round* r = it == rounds_.end() ? nullptr : it->second.get();
    if (r != nullptr && !r->sealed() && now >= TailEnd(*r)) Seal(r, now);
    if (r == nullptr || r->sealed()) {
      armed_[i] = armed_.back();
      armed_.pop_back();
      continue;
    }
    next = std::min(next, TailEnd(*r));
    ++i;
  }
  return next;
}

void DataThread::Seal(Round* round, absl::Time now) {
  const LossTracker& t = *round->bounded;
  // The guarantee: nothing seals with a class-0 contribution missing or more than ε missing.
  DLCP_CHECK_EQ(t.class0_missing(), 0u);
  DLCP_CHECK_LE(t.droppable_missing(), t.allowed_missing());
  round->Seal();
  if (round->tail.armed) round->tail.wait = now - round->tail.armed_at;
  const uint32_t world = round->job()->world;
  for (uint32_t c = 0; c < t.chunk_count(); ++c) {
    if (!t.owned(c) || round->IsComplete(c)) continue;  // complete chunks went out as they completed
    for (uint32_t w = 0; w < world; ++w) {
      const uint8_t cls = t.class_of(w, c);
      round->results().NoteClass(c, std::min<uint8_t>(cls, wire::kNumClasses - 1));
      // Left out for good, in the class its worker declared (unknown: class 0, the most
      // cautious answer for the others' windows).
      if (!round->Has(w, c)) round->results().NoteLost(c, cls < wire::kNumClasses ? cls : 0);
    }
    SendResultToAll(*round, c, now);
  }
  for (uint32_t w = 0; w < world; ++w) {
    for (uint32_t c = 0; c < t.chunk_count(); ++c) {
      const uint8_t cls = t.class_of(w, c);
      if (cls != wire::kNotHere) metrics_.contributions[cls][!t.got(w, c)]->Add();
    }
    SendStop(*round, w);
  }
  metrics_.loss_ratio->Observe(t.droppable_total() ? static_cast<double>(t.droppable_missing()) / t.droppable_total() : 0);
  metrics_.stop_seconds->Observe(absl::ToDoubleSeconds(now - round->created()));
  metrics_.tail_wait_seconds->Observe(absl::ToDoubleSeconds(round->tail.wait));
  if (now > round->created()) {
    metrics_.tail_wait_ratio->Observe(absl::FDivDuration(round->tail.wait, now - round->created()));
  }
}

void DataThread::SendStop(const Round& r, uint32_t rank) {
  const LossTracker& t = *r.bounded;
  const Member& m = r.job()->members[rank];
  if (!m.joined() || r.Carried(rank)) return;  // a carried rank hears through its stage
  std::vector<uint32_t> left_out;
  for (uint32_t c = 0; c < t.chunk_count(); ++c) {
    if (t.class_of(rank, c) != wire::kNotHere && !t.got(rank, c)) left_out.push_back(c);
  }
  const size_t max_payload = wire::ControlPayloadLimit(transport_->max_datagram(), r.job()->chunk_bytes);
  std::vector<wire::ChunkRange> ranges = wire::ToRanges(left_out);
  for (std::vector<uint8_t>& p : wire::EncodeStop(t.droppable_total(), t.droppable_missing(), ranges, max_payload)) {
    wire::Header h = RoundHeader(r, wire::MsgType::kStop, rank);  // class 0
    h.chunk = wire::EncodeTailWait(r.tail.wait);
    h.payload_len = static_cast<uint32_t>(p.size());
    SendOwned(*r.job(), m.address(), h, std::move(p));
  }
}

void DataThread::RepairBounded(const Round& r, int64_t only_rank, bool ask_manifests) {
  LossTracker& t = *r.bounded;
  // While the transfer runs, chunks asked for once are not asked again: their resend may be
  // on its way. Quiet (or a worker's own request) asks again for everything still needed.
  std::vector<std::vector<uint32_t>> plan = t.RepairPlan(r.round(), /*fresh_only=*/!ask_manifests);
  // A host stage's contributions are repaired by its first rank, which pushes them all at once.
  for (uint32_t w = 0; w < t.world(); ++w) {
    const uint32_t carrier = r.CarrierOf(w);
    if (carrier == w || plan[w].empty()) continue;
    std::vector<uint32_t>& to = plan[carrier];
    to.insert(to.end(), plan[w].begin(), plan[w].end());
    std::sort(to.begin(), to.end());
    to.erase(std::unique(to.begin(), to.end()), to.end());
    plan[w].clear();
  }
  for (uint32_t w = 0; w < t.world(); ++w) {
    if (r.Carried(w)) continue;
    if (only_rank >= 0 && w != only_rank) continue;
    // An empty NACK asks a worker whose manifest is incomplete to send it again.
    if ((ask_manifests && !t.has_manifest(w)) || !plan[w].empty()) SendRanges(wire::MsgType::kPushNack, r, w, plan[w]);
  }
}

}  // namespace dlcp::server
