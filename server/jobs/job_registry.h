// Jobs and their members, as this aggregator knows them. Written by the gRPC control threads,
// read by the data threads on every packet. Lookups take a shared lock on the job map only; the
// per-member fields the data path reads are atomics, so a join or heartbeat never stalls it.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/base/clock.h"
#include "common/metrics/registry.h"
#include "common/transport/address.h"
#include "common/transport/atomic_address.h"
#include "common/wire/mac.h"
#include "server/jobs/key_ring.h"
#include "server/jobs/memory_budget.h"
#include "server/jobs/regroup_barrier.h"
#include "server/jobs/roster.h"
#include "common/metrics/straggler_board.h"
#include "server/jobs/waiting_board.h"

namespace dlcp::server {

struct JobLimits {
  uint32_t max_jobs = 64;
  // Jobs one client (JoinSpec::client) may have created and still running here, so that one
  // cannot take every job slot.
  uint32_t max_jobs_per_client = 16;
  uint32_t max_workers = 1024;
  uint32_t max_rounds_in_flight = 256;
  uint64_t max_job_bytes = 4ull << 30;
  // Accumulator bytes all jobs together may hold (MemoryBudget); at least max_job_bytes.
  uint64_t max_memory_bytes = 4ull << 30;
  // Told to clients at Join, so they heartbeat well within it.
  absl::Duration heartbeat_timeout = absl::Seconds(3);
  // Give every job a data-plane key and require a valid MAC on every data packet.
  bool data_auth = true;
  // Draw a new data key for each job this often (KeyRing, docs/security.md); zero: never.
  absl::Duration data_key_rotation = absl::ZeroDuration();
  // How long the key before the newest is still accepted once every member holds the newest.
  absl::Duration data_key_grace = absl::Seconds(1);
  // Hand each member keys derived for its rank, not the job's secret (KeyRing): no member can
  // then sign as another. False: every member gets the secret, for clients from before.
  bool per_worker_data_keys = true;
};

struct Member {
  AtomicAddress data_address;  // empty: not joined
  std::atomic<int64_t> last_heartbeat_ns{0};
  std::atomic<int64_t> left_ns{0};  // when it last left; its stragglers after that are late, not invalid

  bool joined() const { return data_address.Load().has_value(); }
  Address address() const { return data_address.Load().value_or(Address{}); }
};

struct Job {
  Job(uint32_t id, std::string name, uint32_t world, uint32_t chunk_bytes, uint64_t max_bytes, uint32_t epoch,
      std::optional<wire::MacKey> mac_key = std::nullopt, bool per_worker_keys = true,
      std::shared_ptr<MemoryBudget> memory = nullptr)
      : id(id), name(std::move(name)), world(world), chunk_bytes(chunk_bytes), max_bytes(max_bytes),
        memory(std::move(memory)), epoch(epoch),
        ring(mac_key ? std::make_unique<KeyRing>(*mac_key, world, per_worker_keys) : nullptr), members(world),
        roster(world), stragglers(world), regroup(world) {}

  const uint32_t id;
  const std::string name;
  const uint32_t world;
  const uint32_t chunk_bytes;
  const uint64_t max_bytes;  // accumulator budget across all of the job's rounds
  // The aggregator's, shared by every job (null: none, in tests that make jobs by hand).
  const std::shared_ptr<MemoryBudget> memory;
  // Random per incarnation of a job name, so packets of an earlier incarnation never match, and
  // new again at each regroup (aggregator fail-over), so no round of the old layout mixes in.
  std::atomic<uint32_t> epoch;
  // The job's data-plane keys here; null when data authentication is off.
  const std::unique_ptr<KeyRing> ring;
  // What packets from members may be signed with now; null without data authentication.
  const KeyRing::Keys* keys() const { return ring ? &ring->Current() : nullptr; }
  // What this aggregator signs packets to rank `rank` with now; null without data authentication.
  const wire::MacKey* result_key(uint32_t rank) const { return ring ? ring->Current().send(rank) : nullptr; }
  // What rank `rank` signs with now (its per-worker key); null without data authentication.
  const wire::MacKey* worker_key(uint32_t rank) const { return ring ? ring->Current().newest->worker(rank) : nullptr; }
  std::vector<Member> members;
  std::string creator;  // JoinSpec::client of the Join that created it; set before it is shared
  Roster roster;  // who holds each rank, and the aggregators the job was given
  WaitingBoard waiting;  // which ranks its open rounds wait for, for heartbeat answers
  StragglerBoard stragglers;  // how late each rank delivers its part of a round
  std::atomic<uint32_t> member_count{0};
  // When it was created: ReapIdle counts it as heard from then, or a job could be reaped between
  // its creation and its first member's join, before that member had been heard from at all.
  const int64_t created_ns = MonotonicNanos();
  std::atomic<bool> closed{false};  // set when the job ends; data threads then release its rounds
  // The last member left through Leave (not reaped): rounds it had fully received were delivered,
  // even if their DONE lost the race with the Leave.
  std::atomic<bool> left_gracefully{false};
  std::atomic<uint32_t> rounds_in_flight{0};
  std::atomic<uint64_t> bytes_in_use{0};
  std::atomic<uint64_t> rounds_completed{0};
  RegroupBarrier regroup;

  // A member died (no heartbeat within the deadline) or left mid-round: the job cannot complete
  // another round, and every survivor is told why. It lasts until every rank has joined again
  // (Recover: the job goes on, in the epoch SuccessorEpoch() names), or every member has left.
  std::atomic<bool> failed{false};
  // Times the job went on after a failure; clients see it in heartbeats and start their rounds
  // again from 0 in the new epoch.
  std::atomic<uint32_t> rejoins{0};
  // A member left or was removed while others stayed: a worker taking its rank is a restart, and
  // the job goes on in a new epoch once every rank is back, failed or not.
  std::atomic<bool> vacated{false};
  uint32_t SuccessorEpoch() const;
  // With every rank joined again: clears the failure and moves to SuccessorEpoch(). Returns false
  // if there was nothing to recover (another Join did it first).
  bool Recover();
  // The (epoch, rejoins) a joining worker works in: the job's now, or, while it waits for missing
  // ranks, those it will have once they are back.
  std::pair<uint32_t, uint32_t> EpochForJoiner() const;
  void Fail(const std::string& reason) {
    std::lock_guard<std::mutex> lock(failure_mu);
    if (failure.empty()) failure = reason;
    failed.store(true);
  }
  std::string failure_reason() const {
    std::lock_guard<std::mutex> lock(failure_mu);
    return failure;
  }
  // Why `rank` last left, as it said in its Leave; empty if it gave no reason.
  void NoteLeft(uint32_t rank, const std::string& reason) {
    std::lock_guard<std::mutex> lock(failure_mu);
    left_because.resize(world);
    left_because[rank] = reason;
  }
  std::string LeftBecause(uint32_t rank) const {
    std::lock_guard<std::mutex> lock(failure_mu);
    return rank < left_because.size() ? left_because[rank] : "";
  }

  // Host stage (docs/host-stage.md): the ranks that share a host stage with a joining member, its
  // first rank pushing their sum. Every member of a group gives the same list; one that gives
  // another is FAILED_PRECONDITION naming both. Validated by CheckHostGroup first.
  absl::Status SetHostGroup(const std::vector<uint32_t>& group);
  // The group `rank` pushes for, itself first; null when it pushes only its own data.
  std::shared_ptr<const std::vector<uint32_t>> HostGroupLedBy(uint32_t rank) const;
  // `rank` is in a host group it does not lead: its data goes through that group's first rank.
  bool Carried(uint32_t rank) const;

 private:
  mutable std::mutex groups_mu;
  std::vector<std::shared_ptr<const std::vector<uint32_t>>> host_groups;  // by first rank
  mutable std::mutex failure_mu;
  std::string failure;
  std::vector<std::string> left_because;
};

struct JoinSpec {
  std::string job_name;
  uint32_t world_size = 0;
  uint32_t rank = 0;
  uint32_t chunk_bytes = 0;
  Address data_address;
  Joiner joiner;
  // Who asks (its certificate's identity, or its address), for max_jobs_per_client; empty:
  // not counted.
  std::string client;
  // The ranks of its host stage, ascending, rank among them (JoinRequest.host_group); empty: none.
  std::vector<uint32_t> host_group;
};

// Under mutual TLS a job belongs to the certificate identity that created it (Job::creator), and
// a call for it from another identity is refused, naming both. Without client certificates a
// caller is known only by its address, which a job's workers do not share: nothing is checked.
absl::Status CheckJobOwner(const Job& job, const std::string& client);

// The most ranks one host stage may carry.
inline constexpr uint32_t kMaxHostGroup = 256;
// INVALID_ARGUMENT unless `group` is empty or 2..kMaxHostGroup ranks below `world`, ascending,
// holding `rank`.
absl::Status CheckHostGroup(const std::vector<uint32_t>& group, uint32_t rank, uint32_t world);

// The job id every aggregator derives from the name, so workers need no id service.
uint32_t JobIdForName(const std::string& name);

class JobRegistry {
 public:
  explicit JobRegistry(JobLimits limits);

  const JobLimits& limits() const { return limits_; }
  // Validates the request and adds (or re-adds) the member. InvalidArgument names the bad field;
  // FailedPrecondition when it contradicts the job's existing shape; ResourceExhausted past limits.
  absl::StatusOr<std::shared_ptr<Job>> Join(const JoinSpec& spec);
  // `reason`: why the worker left, if on an error; kept for the failure it may cause (Job::LeftBecause).
  absl::Status Leave(uint32_t job_id, uint32_t rank, const std::string& reason = "");
  // `key_generation`: the data key the member holds (KeyRing::Holds); 0 says nothing.
  // `incarnation`: the member's (Joiner); FailedPrecondition naming the holder when another
  // process has taken its rank since.
  absl::Status Heartbeat(uint32_t job_id, uint32_t rank, uint32_t key_generation = 0, uint64_t incarnation = 0);

  // Key rotation (KeyRing): moves every job's rotation on, and starts one for each job whose
  // newest key is data_key_rotation old. Returns one line per phase change, for the log.
  std::vector<std::string> TendKeys(absl::Time now);
  // Starts a rotation of one job's key now. False if one is under way; NotFound, FailedPrecondition
  // (no data authentication) otherwise.
  absl::StatusOr<bool> RotateKey(uint32_t job_id, absl::Time now);

  // Fails every job with a member whose last heartbeat (or join) is older than `timeout`, and
  // removes that member. Returns one line per failure, for the log.
  std::vector<std::string> FailSilentMembers(int64_t now_ns, absl::Duration timeout);

  // Removes jobs none of whose members has joined or sent a heartbeat within `idle` of `now_ns`,
  // and jobs with no member left (every one removed for its silence) once the heartbeat timeout
  // has passed: workers that died without leaving must not hold a job slot. Returns their names.
  std::vector<std::string> ReapIdle(int64_t now_ns, absl::Duration idle);

  // Aggregator fail-over: see RegroupBarrier. NotFound / FailedPrecondition for a job or rank that
  // is not here; `reply` runs once, possibly before this returns. Disagreeing workers fail the job.
  absl::Status Regroup(uint32_t job_id, RegroupArrival arrival, RegroupBarrier::Reply reply);
  // Ends regroups whose deadline passed, failing their jobs; one line per failure, for the log.
  std::vector<std::string> ExpireRegroups(absl::Time now);

  std::shared_ptr<Job> Find(uint32_t job_id) const;
  std::vector<std::shared_ptr<Job>> List() const;
  size_t size() const;
  // True for a job that ended within the last minute: its stragglers are late, not invalid.
  bool RecentlyClosed(uint32_t job_id) const;

  // Registers dlcp_jobs, dlcp_workers and dlcp_rounds_in_flight, read live at collection.
  void ExportMetrics(MetricsRegistry* metrics);
  // Registers the straggler metrics (StragglerBoard): for each job, its `k` latest ranks'
  // dlcp_rank_lateness_mean_seconds, dlcp_rank_lateness_seconds (p50 and p99) and
  // dlcp_rank_last_ratio, labelled with job and rank, so that their number stays bounded by
  // jobs x k. k = 0 registers none.
  void ExportSlowestRanks(MetricsRegistry* metrics, uint32_t k);

 private:
  absl::Status CheckJoin(const JoinSpec& spec) const;  // the spec's own limits
  // The job of `spec`'s name (id `id`), or a new incarnation of it; takes mu_.
  absl::StatusOr<std::shared_ptr<Job>> FindOrCreate(const JoinSpec& spec, uint32_t id);
  // `spec`'s process takes its rank: a first join, a rejoin of a failed job, or a restart.
  static void TakeRank(Job& job, const JoinSpec& spec);
  static std::vector<bool> JoinedRanks(const Job& job);
  // KeyRing::Advance, counting rotations settled; a line for the log if the phase changed.
  std::optional<std::string> AdvanceKeys(Job& job, absl::Time now);
  absl::StatusOr<bool> DrawKey(Job& job, absl::Time now);  // KeyRing::Rotate, counting keys drawn
  void RememberClosed(uint32_t job_id);  // with mu_ held
  uint32_t NextEpoch(uint32_t job_id);  // lock-free: a regroup calls it under its barrier's lock

  JobLimits limits_;
  std::shared_ptr<MemoryBudget> memory_;  // limits_.max_memory_bytes, over every job
  std::atomic<uint64_t> epoch_seed_;
  std::atomic<uint64_t> keys_drawn_{0};
  std::atomic<uint64_t> keys_settled_{0};
  std::deque<std::pair<uint32_t, int64_t>> closed_;  // (job id, when), oldest first
  mutable std::shared_mutex mu_;
  std::unordered_map<uint32_t, std::shared_ptr<Job>> jobs_;
};

}  // namespace dlcp::server
