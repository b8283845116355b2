// One data thread of dlcpd: validates packets, accumulates pushes into rounds, sends results,
// and runs the repair timers of its rounds. Everything here is touched only by its own thread,
// except Stop() and the transport counters.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <random>
#include <unordered_map>

#include "common/datapath/outbox.h"
#include "common/datapath/path_shares.h"
#include "common/metrics/registry.h"
#include "common/faults/drop_injector.h"
#include "common/transport/transport.h"
#include "common/wire/header.h"
#include "server/data/data_metrics.h"
#include "server/data/data_plane.h"
#include "server/jobs/job_registry.h"
#include "server/rounds/round.h"

namespace dlcp::server {

class DataThread {
 public:
  DataThread(uint32_t index, std::unique_ptr<Transport> transport, const DataPlaneOptions& options,
             JobRegistry* jobs, MetricsRegistry* metrics);

  void Run();
  void Stop();
  Transport* transport() const { return transport_.get(); }

 private:
  // The epoch keeps incarnations of a job name apart: a restarted job counts rounds from 0 again.
  struct RoundKey {
    uint32_t job, epoch, key, round;
    bool operator==(const RoundKey&) const = default;
  };
  struct RoundKeyHash {
    size_t operator()(const RoundKey& k) const {
      return std::hash<uint64_t>()(((static_cast<uint64_t>(k.job) << 32 | k.key) * 0x9E3779B97F4A7C15ULL) ^
                                   (static_cast<uint64_t>(k.epoch) << 32 | k.round));
    }
  };
  struct FloorKey {
    uint32_t job, epoch, key;
    bool operator==(const FloorKey&) const = default;
  };
  struct FloorKeyHash {
    size_t operator()(const FloorKey& k) const {
      return std::hash<uint64_t>()((static_cast<uint64_t>(k.job) << 32 | k.key) * 0x9E3779B97F4A7C15ULL ^ k.epoch);
    }
  };
  using RoundMap = std::unordered_map<RoundKey, std::unique_ptr<Round>, RoundKeyHash>;
  struct ErrorKey {
    uint32_t job, key, round, rank;
    auto operator<=>(const ErrorKey&) const = default;
  };

  void HandleDatagram(const InMessage& m, absl::Time now);
  void HandlePush(const wire::Header& h, const uint8_t* payload, Round* round, absl::Time now);
  void HandleResultReq(const wire::Header& h, const uint8_t* payload, Round* round);

  // Bounded loss (bounded_rounds.cc).
  void HandleManifest(const wire::Header& h, const uint8_t* payload, Round* round, absl::Time now);
  // Arms the tail timer once the bound is met; seals at once when everything is in.
  void CheckBound(Round* round, absl::Time now);
  // Ends the round: final results for every owned chunk, and a STOP to each worker.
  void Seal(Round* round, absl::Time now);
  void SendStop(const Round& r, uint32_t rank);
  // NACKs what the bound needs, to every worker or only to `only_rank`; with ask_manifests, an
  // empty NACK to each worker whose manifest is incomplete.
  void RepairBounded(const Round& r, int64_t only_rank = -1, bool ask_manifests = true);
  // Seals the armed rounds whose tail has passed; returns the earliest tail still pending.
  absl::Time FireTails(absl::Time now);
  // When an armed round's tail ends: a quiet spell after its latest contribution.
  absl::Time TailEnd(const Round& r) const;
  // The quiet spell after a round's latest contribution that makes a repair due: 16 of its own
  // mean gaps, within [1 ms, repair_timeout] (common/datapath/quiet_spell.h).
  absl::Duration RepairInterval(const Round& r) const;
  // How long a result copy counts as on its way (Round::ResultMayBeOnItsWay): the repair
  // interval, and at least kMinResultResend (or repair_timeout, if less). Results asked for
  // again while the round still runs queue behind its pushes; on the congested test bed, copies
  // sent again after 1 ms still multiplied into storms of 40 s rounds, and after 5 ms did not.
  absl::Duration ResultResendInterval(const Round& r) const;
  static constexpr absl::Duration kMinResultResend = absl::Milliseconds(5);
  // Finds or creates the round for a validated header; nullptr when the packet is to be dropped.
  Round* RoundFor(const wire::Header& h, const std::shared_ptr<Job>& job, absl::Time now);
  // With kFlagLeftOut when rank's contribution is not in a sealed round's sum, and
  // kFlagRepaired when a contribution came in a repair or was left out, or the result goes
  // `again`, with the most important class any of those was lost in (Round::lost_class).
  // It rides the chunk's result class (Round::result_class), on a path `shares` picks (rank's
  // entry of JobResultShares; nullptr: the transport's turns). `payload` (ResultPayload) and its
  // digest may come from the caller, which sends the same result to every worker.
  struct ResultDigest {
    const wire::MacKey* key;  // signs the copy; null: no authentication
    uint64_t digest;          // wire::PayloadDigest under it
  };
  void SendResult(Round& r, uint32_t chunk, uint32_t rank, PathShares* shares, absl::Span<const uint8_t> payload = {},
                  const ResultDigest* digest = nullptr, bool again = false);
  // A final result to every worker: one payload, encoded once.
  void SendResultToAll(Round& r, uint32_t chunk, absl::Time now);
  // The shares of the paths results take to each rank of the round's job incarnation, indexed
  // by rank; nullptr when results are not steered. Looked up once per batch of results: the
  // pointer is good until the next lookup or prune.
  std::vector<PathShares>* JobResultShares(const Round& r);
  // `rank` has every result of `r` (or gave up on the rest): weigh the paths' losses.
  void MarkDone(Round& r, uint32_t rank);
  // The result's payload in the round's encoding. Float32 points into the accumulator (or at
  // zeros); other encodings are written into `storage`.
  absl::Span<const uint8_t> ResultPayload(const Round& r, uint32_t chunk, std::vector<uint8_t>* storage);
  // A header addressed to `rank` about round `r`; callers fill in chunk, priority and payload.
  static wire::Header RoundHeader(const Round& r, wire::MsgType type, uint32_t rank);
  void SendRanges(wire::MsgType type, const Round& r, uint32_t rank, const std::vector<uint32_t>& chunks);
  // Payload: one byte of absl::StatusCode, then the reason in UTF-8.
  void SendError(const Job& job, const wire::Header& h, const Address& to, absl::StatusCode code,
                 const std::string& reason);
  // Queues one datagram to rank h.rank (authenticated under its results key, if the job has keys)
  // and counts it.
  void SendOwned(const Job& job, const Address& to, const wire::Header& h, std::vector<uint8_t> payload);
  void CountTx(const wire::Header& h);
  static std::string JobFailedMessage(const Job& job);
  // Workers gave tensors of different lengths for one key and round: every member is told at once,
  // naming both lengths and the ranks, and the round is dropped; later packets of it get the same.
  void RefuseMismatch(RoundMap::iterator it, const wire::Header& h, const Job& job, absl::Time now);
  // Answers `h` with the refusal of its round, if it has one; returns whether it did.
  bool RefusedRound(const wire::Header& h, const Job& job);
  void MaybeFree(RoundMap::iterator it);
  // Takes `it` out of the map; its memory is kept until the outbox is next sent (Run), since
  // queued results may point into it. Returns the next iterator.
  RoundMap::iterator Retire(RoundMap::iterator it);
  // With no round left on this thread and no job on the aggregator, gives the cached blocks and
  // the allocator's free memory back to the system, so an idle dlcpd returns to its idle size:
  // once after its last round ended, and on thread 0 every 5 s while idle.
  void TrimWhenIdle(absl::Time now);
  void CountCompleted(const Round& r);
  void ScanTimers(absl::Time now);
  void PruneJobState(absl::Time now);  // floors and result shares of ended jobs, old ERROR times
  // What the timer scan does with a round: release it, look again (its job failed just now), or
  // keep it and schedule its repairs.
  enum class Fate { kRelease, kAgain, kLive };
  Fate Triage(Round& r, absl::Time now);
  // Fails the job when a worker that left still owes `r` data; returns whether the job failed.
  bool FailForLeaver(Job& job, const Round& r);
  void ScheduleRepairs(Round& r, absl::Time now);
  // Notes on its job's WaitingBoard the ranks `r` has nothing from, if it has waited a second.
  static void NoteWaiting(const Round& r, absl::Time now);
  void Reject(wire::Reject reason);
  void Check(absl::Status s);

  uint32_t index_;
  std::unique_ptr<Transport> transport_;
  DataPlaneOptions options_;
  JobRegistry* jobs_;
  Outbox outbox_;
  BlockPool pool_;
  RoundMap rounds_;
  std::vector<std::unique_ptr<Round>> retired_;  // released since the last Flush (Retire)
  bool trimmed_ = true;                          // nothing cached since the last TrimWhenIdle
  absl::Time last_trim_ = absl::InfinitePast();
  // Per (job incarnation, key): every round below this one has been delivered and freed.
  std::unordered_map<FloorKey, uint32_t, FloorKeyHash> floor_;
  // When each (round, worker) last got an ERROR; pruned by the timer scan.
  std::map<ErrorKey, absl::Time> errors_sent_;
  // Rounds refused for a length mismatch (RefuseMismatch): why, and since when; pruned after the
  // round timeout.
  std::unordered_map<RoundKey, std::pair<std::string, absl::Time>, RoundKeyHash> refused_;
  // Result steering: per job incarnation (job << 32 | epoch), each rank's path shares. Dropped
  // with the job's floors.
  std::unordered_map<uint64_t, std::vector<PathShares>> result_shares_;
  bool steer_results_ = false;
  std::vector<RoundKey> armed_;  // rounds waiting out their tail
  absl::Time next_tail_ = absl::InfiniteFuture();
  // The earliest time a round may need a repair (its quiet spell over, its backoff passed), so
  // that repairs follow the rounds' own pace rather than the tick.
  absl::Time next_repair_ = absl::InfiniteFuture();
  absl::Time last_waiting_note_ = absl::InfinitePast();  // NoteWaiting runs about once a second
  std::vector<float> zeros_;     // the result of a chunk nobody's contribution reached
  std::vector<float> aligned_;   // a misaligned push payload, copied
  DropInjector injector_;
  std::atomic<bool> stop_{false};
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> uniform_{0.0, 1.0};
  absl::Time last_scan_;
  absl::Time last_floor_prune_;

  DataMetrics metrics_;
};

}  // namespace dlcp::server
