#include "server/data/data_thread.h"

#include <algorithm>
#include <cstring>

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "common/base/log.h"
#include "common/base/sanitizers.h"
#include "common/datapath/quiet_spell.h"
#include "common/wire/geometry.h"
#include "common/wire/ranges.h"

namespace dlcp::server {
namespace {
constexpr int kMaxRepairBackoff = 16;
// How often an idle dlcpd gives the allocator's free memory back even with no round ended since.
constexpr absl::Duration kIdleTrimInterval = absl::Seconds(5);

}  // namespace

DataThread::DataThread(uint32_t index, std::unique_ptr<Transport> transport, const DataPlaneOptions& options,
                       JobRegistry* jobs, MetricsRegistry* metrics)
    : index_(index),
      transport_(std::move(transport)),
      options_(options),
      jobs_(jobs),
      outbox_(transport_.get()),
      pool_(options.block_cache_bytes),
      injector_([&] {
        DropInjectorOptions o = options.inject_class;
        o.seed += index;
        return o;
      }()),
      rng_(options.inject_seed + index),
      last_scan_(MonotonicNow()),
      metrics_(DataMetrics::Make(metrics)) {
  // A result's path is kept in a byte (Round::NoteResultPath).
  const size_t paths = transport_->send_paths();
  steer_results_ = options.result_steering && paths >= 2 && paths <= 255;
}

void DataThread::Stop() {
  stop_.store(true);
  transport_->Wake();
}

void DataThread::Check(absl::Status s) {
  if (!s.ok()) {
    metrics_.send_errors->Add();
    DLCP_LOG(Warning) << "data thread " << index_ << ": " << s;
  }
}

void DataThread::Reject(wire::Reject reason) { metrics_.rejects[static_cast<size_t>(reason)]->Add(); }

void DataThread::Run() {
  std::vector<InMessage> batch;
  while (!stop_.load(std::memory_order_relaxed)) {
    // Sleep until the next tick, tail end or repair due, whichever comes first.
    absl::Time wake = std::min(last_scan_ + options_.tick, next_repair_);
    if (!armed_.empty()) wake = std::min(wake, next_tail_);
    const absl::Duration wait = std::clamp(wake - MonotonicNow(), absl::ZeroDuration(), options_.tick);
    absl::Status s = transport_->Receive(&batch, wait);
    if (!s.ok()) {
      DLCP_LOG(Error) << "data thread " << index_ << " receive failed: " << s;
      absl::SleepFor(options_.tick);  // a persistent socket error must not spin a core
      continue;
    }
    const absl::Time now = MonotonicNow();
    for (const InMessage& m : batch) HandleDatagram(m, now);
    if (!armed_.empty()) next_tail_ = FireTails(MonotonicNow());
    if (now - last_scan_ >= options_.tick || now >= next_repair_) {
      ScanTimers(now);
      last_scan_ = now;
    }
    Check(outbox_.Flush());
    retired_.clear();
    if (rounds_.empty()) TrimWhenIdle(now);
  }
}

void DataThread::HandleDatagram(const InMessage& m, absl::Time now) {
  wire::Header h;
  wire::Reject r = wire::ParseHeader(absl::MakeConstSpan(m.data, m.len), &h);
  if (r != wire::Reject::kNone) return Reject(r);
  if (h.type != wire::MsgType::kPush && h.type != wire::MsgType::kResultReq && h.type != wire::MsgType::kManifest) {
    return Reject(wire::Reject::kBadType);
  }
  std::shared_ptr<Job> job = jobs_->Find(h.job);
  if (!job || job->closed.load(std::memory_order_relaxed)) {
    // A DONE or retransmit that lost the race with its job's end is late, not invalid. (Without
    // the job's key it cannot be told from a forgery, so it is never answered.)
    if (jobs_->RecentlyClosed(h.job)) return metrics_.stale->Add();
    return Reject(wire::Reject::kUnknownJob);
  }
  // Authentication first: nothing else about a packet is believed before its MAC checks out.
  if (const KeyRing::Keys* keys = job->keys()) {
    if (!(h.flags & wire::kFlagMac)) return Reject(wire::Reject::kMissingMac);
    if (!keys->Verify(absl::MakeConstSpan(m.data, m.len), h.payload_len, h.rank)) return Reject(wire::Reject::kBadMac);
  }
  if (h.rank >= job->world) return Reject(wire::Reject::kNotMember);
  if (!job->members[h.rank].joined()) {
    const int64_t left = job->members[h.rank].left_ns.load(std::memory_order_relaxed);
    if (left != 0 && MonotonicNanos() - left < absl::ToInt64Nanoseconds(absl::Minutes(1))) {
      return metrics_.stale->Add();
    }
    return Reject(wire::Reject::kNotMember);
  }
  if (h.epoch != job->epoch.load(std::memory_order_relaxed)) return Reject(wire::Reject::kStaleEpoch);
  if (job->failed.load(std::memory_order_relaxed)) {
    SendError(*job, h, job->members[h.rank].address(), absl::StatusCode::kAborted, JobFailedMessage(*job));
    return Reject(wire::Reject::kJobFailed);
  }
  const wire::ChunkGeometry g{h.tensor_elems, job->chunk_bytes / 4};
  if (h.tensor_elems == 0 || h.chunk_count != g.chunk_count()) return Reject(wire::Reject::kShapeMismatch);
  const uint8_t* payload = m.data + wire::kHeaderSize;
  if (h.type == wire::MsgType::kPush &&
      h.payload_len != g.bytes(h.chunk, wire::EncodingWidth(static_cast<wire::Encoding>(h.encoding)))) {
    return Reject(wire::Reject::kShapeMismatch);
  }
  metrics_.rx_packets[static_cast<uint8_t>(h.type)][h.priority]->Add();
  metrics_.rx_bytes[h.priority]->Add(m.len);
  if (injector_.Drop(h.priority)) return metrics_.inject_dropped->Add();
  if (h.type == wire::MsgType::kPush) {
    if (options_.inject_drop > 0 && uniform_(rng_) < options_.inject_drop) return metrics_.inject_dropped->Add();
    // A push for round r says this worker has every result of round r - 1.
    if (h.round > 0) {
      auto prev = rounds_.find(RoundKey{h.job, h.epoch, h.key, h.round - 1});
      if (prev != rounds_.end()) {
        MarkDone(*prev->second, h.rank);
        MaybeFree(prev);
      }
    }
  }
  if (RefusedRound(h, *job)) return;
  Round* round = RoundFor(h, job, now);
  if (round == nullptr) return;
  switch (h.type) {
    case wire::MsgType::kPush:
      return HandlePush(h, payload, round, now);
    case wire::MsgType::kManifest:
      return HandleManifest(h, payload, round, now);
    default:
      return HandleResultReq(h, payload, round);
  }
}

Round* DataThread::RoundFor(const wire::Header& h, const std::shared_ptr<Job>& job, absl::Time now) {
  auto it = rounds_.find(RoundKey{h.job, h.epoch, h.key, h.round});
  if (it != rounds_.end()) {
    if (it->second->geometry().tensor_elems != h.tensor_elems) {
      Reject(wire::Reject::kShapeMismatch);
      RefuseMismatch(it, h, *job, now);
      return nullptr;
    }
    return it->second.get();
  }
  auto fl = floor_.find(FloorKey{h.job, h.epoch, h.key});
  if (fl != floor_.end() && h.round < fl->second) {
    // The round was delivered to every worker and freed: a late duplicate, or a worker asking
    // about a round that expired. Only the latter needs an answer.
    if (h.type == wire::MsgType::kResultReq && !(h.flags & wire::kFlagDone)) {
      SendError(*job, h, job->members[h.rank].address(), absl::StatusCode::kNotFound,
                absl::StrCat("round ", h.round, " of key ", h.key, " is no longer held by this aggregator"));
      Reject(wire::Reject::kUnknownRound);
    } else {
      metrics_.stale->Add();  // a retransmit or DONE that crossed the round's release: expected, harmless
    }
    return nullptr;
  }
  if (h.type == wire::MsgType::kResultReq && (h.flags & wire::kFlagDone)) {
    Reject(wire::Reject::kUnknownRound);
    return nullptr;
  }
  const uint32_t limit = jobs_->limits().max_rounds_in_flight;
  if (job->rounds_in_flight.load(std::memory_order_relaxed) >= limit) {
    Reject(wire::Reject::kOverCapacity);
    SendError(*job, h, job->members[h.rank].address(), absl::StatusCode::kResourceExhausted,
              absl::StrCat("job '", job->name, "' has ", limit,
                           " rounds in flight at this aggregator (dlcpd --max-rounds-in-flight)"));
    return nullptr;
  }
  auto round = std::make_unique<Round>(job, h.key, h.round, wire::ChunkGeometry{h.tensor_elems, job->chunk_bytes / 4},
                                       &pool_, now, h.epoch);
  round->repair.next = now;  // the quiet spell (ScanTimers) decides when a repair is due
  Round* raw = round.get();
  rounds_.emplace(RoundKey{h.job, h.epoch, h.key, h.round}, std::move(round));
  return raw;
}

void DataThread::HandlePush(const wire::Header& h, const uint8_t* payload, Round* round, absl::Time now) {
  // Payloads normally sit 48 bytes into a 64-byte-aligned slot, or a multiple of 4 bytes into a
  // GRO buffer. A sender batching odd-sized datagrams could break that; floats are never read
  // from a misaligned address, so such a payload is copied first.
  const auto encoding = static_cast<wire::Encoding>(h.encoding);
  if (!round->AcceptEncoding(encoding)) return Reject(wire::Reject::kShapeMismatch);
  const float* values = reinterpret_cast<const float*>(payload);
  if (encoding != wire::Encoding::kF32) {
    const uint32_t elems = round->geometry().elems(h.chunk);
    aligned_.resize(elems);
    wire::DecodeValues(payload, elems, encoding, aligned_.data());
    values = aligned_.data();
  } else if (reinterpret_cast<uintptr_t>(payload) % alignof(float) != 0) {
    aligned_.resize(h.payload_len / sizeof(float));
    std::memcpy(aligned_.data(), payload, h.payload_len);
    values = aligned_.data();
  }
  std::shared_ptr<const std::vector<uint32_t>> host_group;
  if (h.contributors > 1) {  // a host stage's sum (docs/host-stage.md)
    host_group = round->HostGroupLedBy(h.rank);
    if (host_group == nullptr) host_group = round->job()->HostGroupLedBy(h.rank);
    if (host_group == nullptr || host_group->size() != h.contributors) {
      return Reject(wire::Reject::kBadHostGroup);
    }
  }
  const Round::AddResult added = round->Add(h.rank, h.chunk, values, now, std::move(host_group));
  if (added == Round::AddResult::kAdded || added == Round::AddResult::kCompleted) {
    round->results().NoteClass(h.chunk, h.priority);
    // Only a repair that was needed: one whose first push arrives after all is a duplicate.
    if (h.flags & wire::kFlagRepaired) {
      round->results().NoteLost(h.chunk, h.lost_class);
      round->job()->stragglers.NoteRepaired(h.rank);
    }
  }
  switch (added) {
    case Round::AddResult::kAdded:
      if (round->bounded) CheckBound(round, now);
      return;
    case Round::AddResult::kSealed:
      metrics_.push_sealed->Add();
      return;
    case Round::AddResult::kDuplicate:
      metrics_.push_duplicate->Add();
      return;
    case Round::AddResult::kNoMemory:
      Reject(wire::Reject::kOverCapacity);
      SendError(*round->job(), h, round->job()->members[h.rank].address(), absl::StatusCode::kResourceExhausted,
                absl::StrCat("job '", round->job()->name, "' exceeds its accumulator budget of ",
                             round->job()->max_bytes, " bytes (dlcpd --max-job-bytes)"));
      return;
    case Round::AddResult::kNoAggregatorMemory:
      Reject(wire::Reject::kOverCapacity);
      SendError(*round->job(), h, round->job()->members[h.rank].address(), absl::StatusCode::kResourceExhausted,
                absl::StrCat("job '", round->job()->name, "': this aggregator's jobs hold ",
                             round->job()->memory->used(), " bytes of accumulators, its limit of ",
                             round->job()->memory->limit(),
                             " over all jobs (dlcpd --max-memory-bytes); try again when another job ends, or "
                             "spread jobs over more aggregators"));
      return;
    case Round::AddResult::kCompleted:
      SendResultToAll(*round, h.chunk, now);
      if (round->bounded) CheckBound(round, now);
      return;
  }
}

void DataThread::HandleResultReq(const wire::Header& h, const uint8_t* payload, Round* round) {
  if (h.flags & wire::kFlagDone) {
    MarkDone(*round, h.rank);
    MaybeFree(rounds_.find(RoundKey{h.job, h.epoch, h.key, h.round}));
    return;
  }
  absl::StatusOr<std::vector<wire::ChunkRange>> ranges =
      wire::DecodeRanges(absl::MakeConstSpan(payload, h.payload_len), h.chunk_count);
  if (!ranges.ok()) return Reject(wire::Reject::kBadPayload);
  // A worker with every result that still asks waits for a STOP: its round is bounded, though no
  // manifest of it reached this aggregator (every one lost, while the pushes got through and
  // completed each chunk). An empty NACK asks for the manifests again; without it, nothing would.
  if (!round->bounded && ranges->empty()) return SendRanges(wire::MsgType::kPushNack, *round, h.rank, {});
  // Results that are final go again. A reliable round also NACKs what it lacks from this
  // worker; a bounded one decides its repairs itself (never more than the bound needs).
  std::vector<uint32_t> nack;
  std::vector<PathShares>* shares = JobResultShares(*round);
  PathShares* rank_shares = shares != nullptr ? &(*shares)[h.rank] : nullptr;
  const absl::Time now = MonotonicNow();
  const absl::Duration interval = ResultResendInterval(*round);
  for (const wire::ChunkRange& r : *ranges) {
    for (uint32_t c = r.first; c < r.first + r.length; ++c) {
      if (round->HasFinalResult(c)) {
        // A copy sent within a repair interval (longer after each copy) may still be on its
        // way; the next request asks again if it was lost.
        if (round->results().ResultMayBeOnItsWay(h.rank, c, now, interval)) {
          metrics_.results_in_flight->Add();
          continue;
        }
        metrics_.results_resent->Add();
        // Asked for again after a quiet spell: the copy sent last was lost on its path.
        if (const int path = round->results().ResultPath(h.rank, c); path >= 0 && rank_shares != nullptr) {
          rank_shares->OnLost(static_cast<uint32_t>(path));
        }
        SendResult(*round, c, h.rank, rank_shares, {}, nullptr, /*again=*/true);
        round->results().NoteResultSentAgain(h.rank, c, now);
      } else if (!round->bounded && !round->Has(h.rank, c)) {
        nack.push_back(c);
      }
    }
  }
  if (round->bounded) {
    // After the seal, the STOP goes again to whoever missed it. Before it, the request says how
    // far the worker has pushed (its chunk field: 1 + the highest chunk pushed here; 0: none),
    // and the worker gets its share of the repair the bound needs.
    if (round->sealed()) {
      metrics_.stops_resent->Add();
      return SendStop(*round, h.rank);
    }
    if (h.chunk > 0) {
      // A host stage's first rank has pushed for every rank of its group.
      const auto group = round->HostGroupLedBy(h.rank);
      for (uint32_t rank : group ? *group : std::vector<uint32_t>{h.rank}) {
        round->bounded->MarkSentThrough(rank, std::min(h.chunk, h.chunk_count) - 1);
      }
    }
    // Planning walks the whole round: once per half repair interval, however many ask.
    if (now - round->repair.last_plan < options_.repair_timeout / 2) return;
    round->repair.last_plan = now;
    return RepairBounded(*round, h.rank);
  }
  if (!nack.empty()) SendRanges(wire::MsgType::kPushNack, *round, h.rank, nack);
}

absl::Duration DataThread::RepairInterval(const Round& r) const {
  // On a slow path the cap would cut the spell short of the round's own gaps between pushes and
  // NACK pushes still on their way (docs/congestion.md, "Slow paths").
  return RepairQuiet(r.created(), r.first_contribution(), r.last_progress(), r.contributions(),
                     options_.repair_timeout);
}

absl::Duration DataThread::ResultResendInterval(const Round& r) const {
  return std::max(RepairInterval(r), std::min(options_.repair_timeout, kMinResultResend));
}

wire::Header DataThread::RoundHeader(const Round& r, wire::MsgType type, uint32_t rank) {
  wire::Header h;
  h.type = type;
  h.job = r.job()->id;
  h.key = r.key();
  h.round = r.round();
  h.chunk_count = r.geometry().chunk_count();
  h.tensor_elems = r.geometry().tensor_elems;
  h.rank = static_cast<uint16_t>(rank);
  h.epoch = r.epoch();
  return h;
}

std::vector<PathShares>* DataThread::JobResultShares(const Round& r) {
  if (!steer_results_) return nullptr;
  const Job& job = *r.job();
  std::vector<PathShares>& shares = result_shares_[static_cast<uint64_t>(job.id) << 32 | r.epoch()];
  if (shares.size() != job.world) {
    shares.assign(job.world, PathShares(static_cast<uint32_t>(transport_->send_paths()),
                                        options_.transport.SprayBurstFor(wire::kHeaderSize + job.chunk_bytes)));
  }
  return &shares;
}

void DataThread::MarkDone(Round& r, uint32_t rank) {
  if (!r.MarkDone(rank)) return;
  std::vector<PathShares>* shares = JobResultShares(r);
  if (shares != nullptr && (*shares)[rank].Update()) metrics_.result_share_updates->Add();
}

void DataThread::SendResultToAll(Round& r, uint32_t chunk, absl::Time now) {
  // One payload for all the workers' copies, encoded once. With per-worker keys each copy is
  // signed with its destination's key, so each costs a pass over the payload, as each push did at
  // its sender; with one key for the job, one digest serves every copy.
  std::vector<uint8_t> storage;
  const absl::Span<const uint8_t> payload = ResultPayload(r, chunk, &storage);
  const KeyRing::Keys* keys = r.job()->keys();  // one snapshot: a rotation may switch keys meanwhile
  ResultDigest digest{nullptr, 0};
  std::vector<PathShares>* shares = JobResultShares(r);
  r.results().NoteResultsSent(chunk, now);
  for (uint32_t w = 0; w < r.job()->world; ++w) {
    if (r.Carried(w)) continue;  // its host stage's first rank hands it the result
    const wire::MacKey* key = keys != nullptr ? keys->send(w) : nullptr;
    if (key != digest.key) digest = {key, wire::PayloadDigest(*key, payload.data(), payload.size())};
    SendResult(r, chunk, w, shares != nullptr ? &(*shares)[w] : nullptr, payload, &digest);
  }
}

void DataThread::SendResult(Round& r, uint32_t chunk, uint32_t rank, PathShares* shares,
                            absl::Span<const uint8_t> payload, const ResultDigest* digest, bool again) {
  const Member& m = r.job()->members[rank];
  if (!m.joined()) return;
  if (options_.inject_drop > 0 && uniform_(rng_) < options_.inject_drop) return metrics_.inject_dropped->Add();
  const uint8_t priority = r.results().result_class(chunk);
  if (injector_.Drop(priority)) return metrics_.inject_dropped->Add();
  wire::Header h = RoundHeader(r, wire::MsgType::kResult, rank);
  h.priority = priority;
  h.chunk = chunk;
  h.contributors = r.contributors(chunk);
  h.encoding = static_cast<uint8_t>(r.encoding());
  std::vector<uint8_t> storage;
  if (payload.empty()) payload = ResultPayload(r, chunk, &storage);
  h.payload_len = static_cast<uint32_t>(payload.size());
  if (r.sealed() && !r.Has(rank, chunk)) h.flags |= wire::kFlagLeftOut;
  const uint8_t lost = std::min(again ? priority : wire::kNumClasses, r.results().lost_class(chunk));
  if (lost < wire::kNumClasses) {
    h.flags |= wire::kFlagRepaired;
    h.lost_class = lost;
  }
  int16_t path = -1;
  if (shares != nullptr) {
    const uint32_t p = shares->Pick();
    shares->OnSent(p);
    r.results().NoteResultPath(rank, chunk, p);
    path = static_cast<int16_t>(p);
  }
  CountTx(h);
  const wire::MacKey* key = digest != nullptr ? digest->key : r.job()->result_key(rank);
  const uint64_t* payload_digest = digest != nullptr && digest->key != nullptr ? &digest->digest : nullptr;
  if (r.encoding() == wire::Encoding::kF32) {
    Check(outbox_.Add(m.address(), h, payload.data(), key, payload_digest, path));
  } else {
    Check(outbox_.AddOwned(m.address(), h, std::vector<uint8_t>(payload.begin(), payload.end()), key, payload_digest,
                           path));
  }
}

absl::Span<const uint8_t> DataThread::ResultPayload(const Round& r, uint32_t chunk, std::vector<uint8_t>* storage) {
  const uint32_t elems = r.geometry().elems(chunk);
  const float* sum = r.Result(chunk);
  if (sum == nullptr) {
    if (zeros_.size() < r.geometry().chunk_elems) zeros_.assign(r.geometry().chunk_elems, 0.0f);
    sum = zeros_.data();
  }
  if (r.encoding() == wire::Encoding::kF32) return {reinterpret_cast<const uint8_t*>(sum), elems * sizeof(float)};
  storage->resize(elems * wire::EncodingWidth(r.encoding()));
  wire::EncodeValues(sum, elems, r.encoding(), storage->data());
  return *storage;
}

void DataThread::SendRanges(wire::MsgType type, const Round& r, uint32_t rank, const std::vector<uint32_t>& chunks) {
  const Member& m = r.job()->members[rank];
  if (!m.joined()) return;
  if (type == wire::MsgType::kPushNack && !chunks.empty()) r.job()->stragglers.NoteNacked(rank, chunks.size());
  std::vector<wire::ChunkRange> ranges = wire::ToRanges(chunks);
  const size_t max_payload = wire::ControlPayloadLimit(transport_->max_datagram(), r.job()->chunk_bytes);
  for (std::vector<uint8_t>& p : wire::EncodeRanges(ranges, max_payload)) {
    wire::Header h = RoundHeader(r, type, rank);  // priority 0: control rides the top class
    h.payload_len = static_cast<uint32_t>(p.size());
    (type == wire::MsgType::kProbe ? metrics_.probes : metrics_.push_nacks)->Add();
    SendOwned(*r.job(), m.address(), h, std::move(p));
  }
}

void DataThread::SendError(const Job& job, const wire::Header& req, const Address& to, absl::StatusCode code,
                           const std::string& reason) {
  // One error per round and worker per repair interval is enough; the rest of a window's pushes
  // would otherwise each draw one.
  auto [it, fresh] = errors_sent_.try_emplace(ErrorKey{req.job, req.key, req.round, req.rank}, MonotonicNow());
  if (!fresh) {
    if (MonotonicNow() - it->second < options_.repair_timeout) return;
    it->second = MonotonicNow();
  }
  wire::Header h = req;
  h.type = wire::MsgType::kError;
  h.priority = 0;
  h.flags = 0;  // Outbox sets kFlagMac when the job has a key
  std::string text;
  text.push_back(static_cast<char>(code));
  text.append(reason, 0, std::min<size_t>(reason.size(), 1024));
  h.payload_len = static_cast<uint32_t>(text.size());
  SendOwned(job, to, h, std::vector<uint8_t>(text.begin(), text.end()));
}

std::string DataThread::JobFailedMessage(const Job& job) {
  return absl::StrCat("job '", job.name, "' failed: ", job.failure_reason(),
                      ". It goes on once every rank has joined again (restart the missing worker), or "
                      "starts again once every worker has left");
}

void DataThread::CountTx(const wire::Header& h) {
  metrics_.tx_packets[static_cast<uint8_t>(h.type)][h.priority]->Add();
  metrics_.tx_bytes[h.priority]->Add(wire::kHeaderSize + h.payload_len);
}

void DataThread::SendOwned(const Job& job, const Address& to, const wire::Header& h, std::vector<uint8_t> payload) {
  CountTx(h);
  Check(outbox_.AddOwned(to, h, std::move(payload), job.result_key(h.rank)));
}

void DataThread::RefuseMismatch(RoundMap::iterator it, const wire::Header& h, const Job& job, absl::Time now) {
  const Round& r = *it->second;
  std::vector<uint32_t> gave;  // the ranks that pushed the round's length
  for (uint32_t w = 0; w < job.world; ++w) {
    if (r.MissingFrom(w).size() < r.geometry().chunk_count()) gave.push_back(w);
  }
  const std::string reason = absl::StrCat(
      "job '", job.name, "' key ", h.key, " round ", h.round, ": rank ", h.rank, " all-reduces a tensor of ",
      h.tensor_elems, " elements, rank", gave.size() == 1 ? " " : "s ", absl::StrJoin(gave, ", "), " one of ",
      r.geometry().tensor_elems, ": every worker must give a key tensors of the same length");
  DLCP_LOG(Warning) << reason;
  for (uint32_t w = 0; w < job.world; ++w) {
    if (!job.members[w].joined()) continue;
    const wire::Header about = w == h.rank ? h : RoundHeader(r, wire::MsgType::kError, w);
    SendError(job, about, job.members[w].address(), absl::StatusCode::kFailedPrecondition, reason);
  }
  refused_[it->first] = {reason, now};
  metrics_.rounds_aborted->Add();
  Retire(it);
}

bool DataThread::RefusedRound(const wire::Header& h, const Job& job) {
  if (refused_.empty()) return false;  // on every datagram: almost always so
  auto it = refused_.find(RoundKey{h.job, h.epoch, h.key, h.round});
  if (it == refused_.end()) return false;
  if (!(h.flags & wire::kFlagDone)) {
    SendError(job, h, job.members[h.rank].address(), absl::StatusCode::kFailedPrecondition, it->second.first);
  }
  return true;
}

void DataThread::MaybeFree(RoundMap::iterator it) {
  if (it == rounds_.end() || !it->second->AllDone()) return;
  Round& r = *it->second;
  uint32_t& floor = floor_[FloorKey{r.job()->id, r.epoch(), r.key()}];
  floor = std::max(floor, r.round() + 1);
  CountCompleted(r);
  Retire(it);
}

DataThread::RoundMap::iterator DataThread::Retire(RoundMap::iterator it) {
  const Round& r = *it->second;
  // A delivered round says who was late; one given up on (its job closed or regrouped) does not.
  // Rounds end here however they are released: at the last DONE, or at a worker's next round.
  if (r.Finished() && !r.Superseded() && !r.job()->closed.load(std::memory_order_relaxed)) {
    r.job()->stragglers.NoteRound(r.delivered_us());
  }
  retired_.push_back(std::move(it->second));
  trimmed_ = false;
  return rounds_.erase(it);
}

void DataThread::TrimWhenIdle(absl::Time now) {
  // Thread 0 also trims again now and then: what the control plane freed (a flood of
  // connections, say) is the allocator's to give back, and no round retiring would prompt it.
  const bool control_due = index_ == 0 && now - last_trim_ >= kIdleTrimInterval;
  if ((trimmed_ && !control_due) || jobs_->size() > 0) return;
  trimmed_ = true;
  last_trim_ = now;
  pool_.Clear();
#if defined(__GLIBC__) && !defined(DLCP_UNDER_SANITIZER)
  // Under a sanitizer glibc's allocator is not the one in use; malloc_trim would set its arenas
  // up from several data threads at once, which glibc does not expect.
  ::malloc_trim(0);
#endif
}

void DataThread::CountCompleted(const Round& r) {
  r.job()->rounds_completed.fetch_add(1, std::memory_order_relaxed);
  metrics_.rounds_completed->Add();
  metrics_.round_seconds->Observe(absl::ToDoubleSeconds(r.last_progress() - r.created()));
}

void DataThread::ScanTimers(absl::Time now) {
  PruneJobState(now);
  next_repair_ = absl::InfiniteFuture();
  const bool note_waiting = now - last_waiting_note_ >= absl::Seconds(1);
  if (note_waiting) last_waiting_note_ = now;
  for (auto it = rounds_.begin(); it != rounds_.end();) {
    Round& r = *it->second;
    switch (Triage(r, now)) {
      case Fate::kRelease:
        it = Retire(it);
        continue;
      case Fate::kAgain:  // its job failed just now: the next look tells the survivors
        continue;
      case Fate::kLive:
        break;
    }
    ScheduleRepairs(r, now);
    if (note_waiting) NoteWaiting(r, now);
    ++it;
  }
}

void DataThread::NoteWaiting(const Round& r, absl::Time now) {
  if (r.Finished() || now - r.created() < absl::Seconds(1)) return;
  WaitingRound w{r.key(), r.round(), {}, absl::ToInt64Nanoseconds(now - r.created()), MonotonicNanos()};
  const uint32_t chunks = r.geometry().chunk_count();
  for (uint32_t rank = 0; rank < r.job()->world; ++rank) {
    if (r.MissingFrom(rank).size() == chunks) w.silent_ranks.push_back(rank);
  }
  if (!w.silent_ranks.empty()) r.job()->waiting.Note(std::move(w));
}

void DataThread::PruneJobState(absl::Time now) {
  // Floors of jobs that ended (or were replaced by a new incarnation) are dropped once a second.
  if (now - last_floor_prune_ >= absl::Seconds(1)) {
    last_floor_prune_ = now;
    for (auto it = floor_.begin(); it != floor_.end();) {
      std::shared_ptr<Job> job = jobs_->Find(it->first.job);
      it = (!job || job->epoch.load() != it->first.epoch) ? floor_.erase(it) : std::next(it);
    }
    for (auto it = result_shares_.begin(); it != result_shares_.end();) {
      std::shared_ptr<Job> job = jobs_->Find(static_cast<uint32_t>(it->first >> 32));
      it = (!job || job->epoch.load() != static_cast<uint32_t>(it->first)) ? result_shares_.erase(it) : std::next(it);
    }
  }
  for (auto it = errors_sent_.begin(); it != errors_sent_.end();) {
    it = now - it->second > options_.repair_timeout * kMaxRepairBackoff ? errors_sent_.erase(it) : std::next(it);
  }
  for (auto it = refused_.begin(); it != refused_.end();) {
    it = now - it->second.second > options_.round_timeout ? refused_.erase(it) : std::next(it);
  }
}

DataThread::Fate DataThread::Triage(Round& r, absl::Time now) {
  Job& job = *r.job();
  if (job.closed.load(std::memory_order_relaxed)) {
    if (job.left_gracefully.load() && r.Finished()) {
      CountCompleted(r);  // delivered; only the DONE lost the race with the Leave
    } else {
      metrics_.rounds_aborted->Add();
    }
    return Fate::kRelease;
  }
  if (r.Superseded()) {
    // The job regrouped (it lost an aggregator): its workers run this round again in the new
    // layout, and tell nobody here about the old one.
    metrics_.rounds_aborted->Add();
    return Fate::kRelease;
  }
  if (job.failed.load(std::memory_order_relaxed)) {
    // Tell every survivor still waiting on this round why it will never finish.
    for (uint32_t w = 0; w < job.world; ++w) {
      if (!r.IsDone(w) && job.members[w].joined()) {
        SendError(job, RoundHeader(r, wire::MsgType::kError, w), job.members[w].address(), absl::StatusCode::kAborted,
                  JobFailedMessage(job));
      }
    }
    metrics_.rounds_aborted->Add();
    return Fate::kRelease;
  }
  if (job.member_count.load(std::memory_order_relaxed) < job.world && !r.Finished() && !r.sealed() &&
      FailForLeaver(job, r)) {
    return Fate::kAgain;
  }
  if (now - r.created() > options_.round_timeout) {
    DLCP_LOG(Warning) << "job " << job.name << " key " << r.key() << " round " << r.round() << " expired after "
                      << options_.round_timeout << " with " << r.open_chunks() << " chunks incomplete";
    metrics_.rounds_expired->Add();
    return Fate::kRelease;
  }
  return Fate::kLive;
}

// A worker that left (its trainer failed and closed its client, say) while this round still
// needs its data: the round can never finish, so neither can the job. Fail it now, naming the
// rank, instead of letting every survivor wait for its op deadline.
bool DataThread::FailForLeaver(Job& job, const Round& r) {
  for (uint32_t w = 0; w < job.world; ++w) {
    if (!job.members[w].joined() && job.members[w].left_ns.load() != 0 && !r.MissingFrom(w).empty()) {
      // Its own reason, when it gave one, is usually the root cause the others want to see (e.g.
      // it lost an aggregator they have not noticed yet).
      const std::string because = job.LeftBecause(w);
      job.Fail(absl::StrCat("worker rank ", w, " left the job", because.empty() ? "" : " (", because,
                            because.empty() ? "" : ")", " while key ", r.key(), " round ", r.round(),
                            " still needed its data"));
      DLCP_LOG(Warning) << "job " << job.name << " failed: " << job.failure_reason();
      break;
    }
  }
  return job.failed.load();
}

void DataThread::ScheduleRepairs(Round& r, absl::Time now) {
  // A bounded round knows which pushes are lost while others still arrive (a later chunk of
  // the same class came in), so it repairs as soon as the bound needs it, not only once the
  // round goes quiet: class-0 repairs overlap the transfer instead of adding to its tail.
  if (r.bounded && !r.sealed() && now - r.repair.last_plan >= options_.repair_timeout / 2 &&
      now - r.last_progress() < options_.repair_timeout) {
    r.repair.last_plan = now;
    RepairBounded(r, -1, /*ask_manifests=*/false);
  }
  const absl::Time quiet_end = r.last_progress() + RepairInterval(r);
  if (now >= r.repair.next && now >= quiet_end) {
    if (r.bounded && !r.sealed()) {
      r.repair.last_plan = now;
      RepairBounded(r);
    } else {
      for (uint32_t w = 0; w < r.job()->world; ++w) {
        if (r.Carried(w)) continue;
        if (!r.Finished()) {
          std::vector<uint32_t> missing = r.MissingFrom(w);
          if (!missing.empty()) SendRanges(wire::MsgType::kPushNack, r, w, missing);
        } else if (!r.IsDone(w)) {
          SendRanges(wire::MsgType::kProbe, r, w, {});
        }
      }
    }
    r.repair.attempts = std::min(r.repair.attempts + 1, kMaxRepairBackoff);
    r.repair.next = now + (quiet_end - r.last_progress()) * r.repair.attempts;
  } else if (now < quiet_end) {
    r.repair.attempts = 0;
  }
  next_repair_ = std::min(next_repair_, std::max(r.repair.next, quiet_end));
}

}  // namespace dlcp::server
