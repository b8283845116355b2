#include "server/jobs/job_registry.h"

#include <algorithm>
#include <unistd.h>

#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "common/base/log.h"
#include "common/topology/topology.h"
#include "common/wire/header.h"

namespace dlcp::server {

uint32_t JobIdForName(const std::string& name) {
  uint32_t id = static_cast<uint32_t>(StableHashString(name));
  return id == 0 ? 1 : id;  // 0 is never a job
}

JobRegistry::JobRegistry(JobLimits limits)
    : limits_(limits),
      memory_(std::make_shared<MemoryBudget>(limits.max_memory_bytes)),
      epoch_seed_(static_cast<uint64_t>(absl::GetCurrentTimeNanos()) ^ (static_cast<uint64_t>(getpid()) << 32)) {}

absl::Status JobRegistry::CheckJoin(const JoinSpec& s) const {
  if (s.job_name.empty() || s.job_name.size() > 128) {
    return absl::InvalidArgumentError("job_name must be 1..128 characters");
  }
  if (s.world_size == 0 || s.world_size > limits_.max_workers) {
    return absl::InvalidArgumentError(absl::StrCat("world_size ", s.world_size, " outside [1, ", limits_.max_workers,
                                                   "] (dlcpd --max-workers)"));
  }
  if (s.rank >= s.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", s.rank, " is not below world_size ", s.world_size));
  }
  if (s.chunk_bytes < 64 || s.chunk_bytes > wire::kMaxPayload || s.chunk_bytes % 4 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes ", s.chunk_bytes, " must be a multiple of 4 in [64, ", wire::kMaxPayload, "]"));
  }
  if (s.data_address.port == 0 && s.data_address.qpn == 0) {
    return absl::InvalidArgumentError("data_port must be 1..65535 (or data_qpn set, for RDMA)");
  }
  return CheckHostGroup(s.host_group, s.rank, s.world_size);
}

absl::Status CheckHostGroup(const std::vector<uint32_t>& group, uint32_t rank, uint32_t world) {
  if (group.empty()) return absl::OkStatus();
  if (group.size() < 2 || group.size() > kMaxHostGroup) {
    return absl::InvalidArgumentError(absl::StrCat("host_group has ", group.size(), " ranks, not 2..", kMaxHostGroup));
  }
  for (size_t i = 0; i < group.size(); ++i) {
    if (group[i] >= world || (i > 0 && group[i] <= group[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("host_group [", absl::StrJoin(group, ","), "] must be ascending ranks below ", world));
    }
  }
  if (std::find(group.begin(), group.end(), rank) == group.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("host_group [", absl::StrJoin(group, ","), "] does not hold the joining rank ", rank));
  }
  return absl::OkStatus();
}

absl::Status Job::SetHostGroup(const std::vector<uint32_t>& group) {
  if (group.empty()) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(groups_mu);
  host_groups.resize(world);
  auto& held = host_groups[group.front()];
  if (held != nullptr && *held != group) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", name, "': host_group [", absl::StrJoin(group, ","), "] differs from [",
                     absl::StrJoin(*held, ","), "], which another rank of that host gave; its workers must share one "
                     "host stage"));
  }
  if (held == nullptr) held = std::make_shared<const std::vector<uint32_t>>(group);
  return absl::OkStatus();
}

bool Job::Carried(uint32_t rank) const {
  std::lock_guard<std::mutex> lock(groups_mu);
  for (const auto& g : host_groups) {
    if (g != nullptr && g->front() != rank && std::find(g->begin(), g->end(), rank) != g->end()) return true;
  }
  return false;
}

std::shared_ptr<const std::vector<uint32_t>> Job::HostGroupLedBy(uint32_t rank) const {
  std::lock_guard<std::mutex> lock(groups_mu);
  return rank < host_groups.size() ? host_groups[rank] : nullptr;
}

absl::Status CheckJobOwner(const Job& job, const std::string& client) {
  if (!absl::StartsWith(job.creator, "certificate ") || client == job.creator) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "job '", job.name, "' belongs to ", job.creator, ", which created it here, and this call came from ",
      client.empty() ? "a caller with no identity" : client,
      ": give every worker of a job a certificate of the same identity, or choose another job name"));
}

absl::StatusOr<std::shared_ptr<Job>> JobRegistry::FindOrCreate(const JoinSpec& s, uint32_t id) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  auto it = jobs_.find(id);
  if (it != jobs_.end() && it->second->name != s.job_name) {
    return absl::AlreadyExistsError(absl::StrCat("job id ", id, " of '", s.job_name, "' collides with job '",
                                                 it->second->name, "'; choose another job name"));
  }
  // A failed job with members left waits for the missing ranks to join again (Join); one that
  // everyone has left starts a new incarnation.
  if (it != jobs_.end() && it->second->failed.load() && it->second->member_count.load() == 0) {
    it->second->closed.store(true);  // a new incarnation replaces the failed one
    RememberClosed(id);
    jobs_.erase(it);
    it = jobs_.end();
  }
  if (it != jobs_.end()) return it->second;
  if (jobs_.size() >= limits_.max_jobs) {
    return absl::ResourceExhaustedError(
        absl::StrCat("aggregator serves its limit of ", limits_.max_jobs, " jobs (dlcpd --max-jobs)"));
  }
  if (!s.client.empty()) {
    const size_t created =
        std::count_if(jobs_.begin(), jobs_.end(), [&](const auto& j) { return j.second->creator == s.client; });
    if (created >= limits_.max_jobs_per_client) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "job '", s.job_name, "' refused: ", s.client, " already created ", created,
          " of the jobs this aggregator serves, its limit (dlcpd --max-jobs-per-client); one of them must end first"));
    }
  }
  const uint32_t epoch = NextEpoch(id);
  std::optional<wire::MacKey> key;
  if (limits_.data_auth) {
    absl::StatusOr<wire::MacKey> k = wire::NewMacKey();
    if (!k.ok()) return k.status();
    key = *k;
  }
  auto job = std::make_shared<Job>(id, s.job_name, s.world_size, s.chunk_bytes, limits_.max_job_bytes, epoch, key,
                                   limits_.per_worker_data_keys, memory_);
  job->creator = s.client;
  jobs_[id] = job;
  return job;
}

absl::StatusOr<std::shared_ptr<Job>> JobRegistry::Join(const JoinSpec& s) {
  if (absl::Status bad = CheckJoin(s); !bad.ok()) return bad;
  const uint32_t id = JobIdForName(s.job_name);
  absl::StatusOr<std::shared_ptr<Job>> found = FindOrCreate(s, id);
  if (!found.ok()) return found.status();
  std::shared_ptr<Job> job = std::move(*found);
  if (absl::Status owner = CheckJobOwner(*job, s.client); !owner.ok()) return owner;
  if (job->world != s.world_size) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", s.job_name, "' has world_size ", job->world, ", not ", s.world_size));
  }
  if (job->chunk_bytes != s.chunk_bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", s.job_name, "' uses chunk_bytes ", job->chunk_bytes, ", not ", s.chunk_bytes));
  }
  if (absl::Status group = job->SetHostGroup(s.host_group); !group.ok()) return group;
  const Member& m = job->members[s.rank];
  const int64_t timeout_ns = absl::ToInt64Nanoseconds(limits_.heartbeat_timeout);
  auto holder_alive = [&] {
    return m.joined() && MonotonicNanos() - m.last_heartbeat_ns.load(std::memory_order_relaxed) <= timeout_ns;
  };
  Job& seated = *job;
  absl::Status admitted = job->roster.Admit(s.job_name, s.rank, s.joiner, holder_alive, [&] { TakeRank(seated, s); });
  if (!admitted.ok()) return admitted;
  DLCP_LOG(Info) << "job " << s.job_name << " (id " << id << ") rank " << s.rank << "/" << s.world_size
                 << " joined, data " << s.data_address.ToString();
  return job;
}

void JobRegistry::TakeRank(Job& job, const JoinSpec& s) {
  Member& m = job.members[s.rank];
  const std::optional<Address> old = m.data_address.Exchange(s.data_address);
  if (!old) {
    // The last missing rank of a failed job is back: the job goes on.
    if (job.member_count.fetch_add(1) + 1 == job.world && job.Recover()) {
      DLCP_LOG(Warning) << "job " << s.job_name << " goes on: rank " << s.rank << " joined again, every rank is back";
    }
  } else if (*old != s.data_address) {
    // Another process under a rank still counted (it restarted within the heartbeat deadline):
    // the old one is gone, and whatever rounds needed it with it.
    job.vacated.store(true);
    DLCP_LOG(Warning) << "job " << s.job_name << " rank " << s.rank << " restarted, now at "
                      << s.data_address.ToString();
    if (job.Recover()) DLCP_LOG(Warning) << "job " << s.job_name << " goes on in a new epoch";
  }
  m.last_heartbeat_ns.store(MonotonicNanos(), std::memory_order_relaxed);
}

absl::Status JobRegistry::Leave(uint32_t job_id, uint32_t rank, const std::string& reason) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  Job& job = *it->second;
  if (rank >= job.world) return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " outside job"));
  job.NoteLeft(rank, reason);
  job.members[rank].left_ns.store(MonotonicNanos());
  if (!job.members[rank].data_address.Exchange(std::nullopt)) return absl::OkStatus();
  if (job.member_count.fetch_sub(1) > 1) {
    job.vacated.store(true);
  } else {
    job.left_gracefully.store(true);
    job.closed.store(true);
    RememberClosed(job.id);
    DLCP_LOG(Info) << "job " << job.name << " closed: last member left";
    jobs_.erase(it);
  }
  return absl::OkStatus();
}

uint32_t Job::SuccessorEpoch() const {
  return static_cast<uint32_t>(StableHash64(epoch.load(), id) >> 7) | 1;  // never 0
}

bool Job::Recover() {
  std::lock_guard<std::mutex> lock(failure_mu);
  if (!(failed.load() || vacated.load()) || member_count.load() != world) return false;
  // Failure off first: in between, a packet of the old epoch may start a round that is dropped
  // as superseded, while one of the new epoch, refused as stale, is sent again; neither is told
  // the job failed.
  const uint32_t next = SuccessorEpoch();
  failed.store(false);
  vacated.store(false);
  failure.clear();
  left_because.clear();
  rejoins.fetch_add(1);
  epoch.store(next);
  return true;
}

std::pair<uint32_t, uint32_t> Job::EpochForJoiner() const {
  std::lock_guard<std::mutex> lock(failure_mu);
  if (failed.load() || vacated.load()) return {SuccessorEpoch(), rejoins.load() + 1};
  return {epoch.load(), rejoins.load()};
}

uint32_t JobRegistry::NextEpoch(uint32_t job_id) {
  return static_cast<uint32_t>(StableHash64(epoch_seed_.fetch_add(1) + 1, job_id)) | 1;  // never 0
}

absl::Status JobRegistry::Regroup(uint32_t job_id, RegroupArrival arrival, RegroupBarrier::Reply reply) {
  std::shared_ptr<Job> job = Find(job_id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  if (arrival.rank >= job->world || !job->members[arrival.rank].joined()) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", arrival.rank, " is not a member of job ", job->name));
  }
  if (job->failed.load()) {
    return absl::AbortedError(absl::StrCat("job '", job->name, "' failed: ", job->failure_reason()));
  }
  arrival.carried = job->Carried(arrival.rank);
  Job* raw = job.get();
  std::optional<std::string> failure = job->regroup.Arrive(
      std::move(arrival),
      [this, raw] {
        const uint32_t epoch = NextEpoch(raw->id);
        // From here on the data threads refuse the old layout's packets and drop its rounds.
        raw->epoch.store(epoch);
        DLCP_LOG(Warning) << "job " << raw->name << " regroups (its aggregators changed): epoch " << epoch;
        return epoch;
      },
      std::move(reply));
  if (failure) {
    job->Fail(*failure);
    DLCP_LOG(Warning) << "job " << job->name << " failed: " << *failure;
  }
  return absl::OkStatus();
}

std::vector<std::string> JobRegistry::ExpireRegroups(absl::Time now) {
  std::vector<std::string> lines;
  for (const std::shared_ptr<Job>& job : List()) {
    if (std::optional<std::string> failure = job->regroup.Expire(now)) {
      job->Fail(*failure);
      lines.push_back(absl::StrCat("job ", job->name, " failed: ", *failure));
    }
  }
  return lines;
}

absl::Status JobRegistry::Heartbeat(uint32_t job_id, uint32_t rank, uint32_t key_generation, uint64_t incarnation) {
  std::shared_ptr<Job> job = Find(job_id);
  if (!job && RecentlyClosed(job_id)) {
    return absl::NotFoundError(absl::StrCat("no job ", job_id, ": it ended here (every worker left or was dropped)"));
  }
  if (!job) {
    // Not a job this process ended: most likely it restarted since the worker joined it (a
    // crashed container back at once). UNAVAILABLE, as the process before it is: the worker
    // treats it as unreachable, and the job moves off it or takes it back (Session), as for an
    // aggregator that was down for the heartbeat deadline.
    return absl::UnavailableError(absl::StrCat("no job ", job_id, " here: this aggregator restarted since the worker "
                                               "joined it, or ended the job over a minute ago"));
  }
  if (rank < job->world && job->members[rank].last_heartbeat_ns.load() == 0) {
    // The rank never joined this job here: it joined the process before this one, and another
    // worker, having lost that one, joined this one first (JobRegistry::Join starts the clock).
    return absl::UnavailableError(absl::StrCat("rank ", rank, " of job '", job->name,
                                               "' never joined this aggregator: it restarted since the worker joined it"));
  }
  if (rank >= job->world || !job->members[rank].joined()) {
    std::string why = job->failed.load() ? absl::StrCat(" (the job failed: ", job->failure_reason(), ")") : "";
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank, " is not a member of job '", job->name, "'", why));
  }
  if (absl::Status s = job->roster.CheckHolder(job->name, rank, incarnation); !s.ok()) return s;
  job->members[rank].last_heartbeat_ns.store(MonotonicNanos(), std::memory_order_relaxed);
  if (job->ring && key_generation > 0) {
    // A generation past the newest counts as the newest: a member claiming a key it does not
    // hold can only lose its own results, which it then cannot check.
    job->ring->Holds(rank, std::min(key_generation, job->ring->Current().generation));
    if (std::optional<std::string> line = AdvanceKeys(*job, MonotonicNow())) DLCP_LOG(Info) << *line;
  }
  return absl::OkStatus();
}

std::vector<bool> JobRegistry::JoinedRanks(const Job& job) {
  std::vector<bool> joined(job.world);
  for (uint32_t r = 0; r < job.world; ++r) joined[r] = job.members[r].joined();
  return joined;
}

std::optional<std::string> JobRegistry::AdvanceKeys(Job& job, absl::Time now) {
  if (!job.ring->Advance(JoinedRanks(job), now, limits_.data_key_grace)) return std::nullopt;
  const KeyRing::Keys& k = job.ring->Current();
  if (!k.previous) keys_settled_.fetch_add(1, std::memory_order_relaxed);
  return absl::StrCat("job ", job.name, ": data key ", k.generation,
                      k.previous ? " signs now: every member holds it" : " settled, the key before it dropped");
}

std::vector<std::string> JobRegistry::TendKeys(absl::Time now) {
  std::vector<std::string> lines;
  for (const std::shared_ptr<Job>& job : List()) {
    if (!job->ring) continue;
    if (std::optional<std::string> line = AdvanceKeys(*job, now)) lines.push_back(std::move(*line));
    if (limits_.data_key_rotation > absl::ZeroDuration() && now - job->ring->drawn() >= limits_.data_key_rotation) {
      absl::StatusOr<bool> started = DrawKey(*job, now);
      if (!started.ok()) {
        lines.push_back(absl::StrCat("job ", job->name, ": cannot draw a new data key: ", started.status().ToString()));
      } else if (*started) {
        lines.push_back(absl::StrCat("job ", job->name, ": data key ", job->ring->Current().generation,
                                     " drawn, rolling out"));
      }
    }
  }
  return lines;
}

absl::StatusOr<bool> JobRegistry::DrawKey(Job& job, absl::Time now) {
  absl::StatusOr<bool> started = job.ring->Rotate(now);
  if (started.ok() && *started) keys_drawn_.fetch_add(1, std::memory_order_relaxed);
  return started;
}

absl::StatusOr<bool> JobRegistry::RotateKey(uint32_t job_id, absl::Time now) {
  std::shared_ptr<Job> job = Find(job_id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", job_id));
  if (!job->ring) return absl::FailedPreconditionError("this aggregator runs without data authentication");
  return DrawKey(*job, now);
}

std::vector<std::string> JobRegistry::FailSilentMembers(int64_t now_ns, absl::Duration timeout) {
  std::vector<std::string> lines;
  std::shared_lock<std::shared_mutex> lock(mu_);
  for (auto& [id, job] : jobs_) {
    for (uint32_t r = 0; r < job->world; ++r) {
      Member& m = job->members[r];
      if (!m.joined()) continue;
      const int64_t silent_ns = now_ns - m.last_heartbeat_ns.load(std::memory_order_relaxed);
      if (silent_ns <= absl::ToInt64Nanoseconds(timeout)) continue;
      if (!m.data_address.Exchange(std::nullopt)) continue;  // left meanwhile
      job->member_count.fetch_sub(1);
      job->vacated.store(true);
      std::string reason = absl::StrCat("worker rank ", r, " sent no heartbeat for ",
                                        absl::FormatDuration(absl::Nanoseconds(silent_ns)), " and was removed");
      job->Fail(reason);
      lines.push_back(absl::StrCat("job ", job->name, ": ", reason));
    }
  }
  return lines;
}

std::vector<std::string> JobRegistry::ReapIdle(int64_t now_ns, absl::Duration idle) {
  std::vector<std::string> reaped;
  std::unique_lock<std::shared_mutex> lock(mu_);
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    int64_t latest = it->second->created_ns;
    for (const Member& m : it->second->members) {
      if (m.joined()) latest = std::max(latest, m.last_heartbeat_ns.load(std::memory_order_relaxed));
    }
    const bool vacant = it->second->member_count.load() == 0;
    if (now_ns - latest > absl::ToInt64Nanoseconds(vacant ? std::min(idle, limits_.heartbeat_timeout) : idle)) {
      it->second->closed.store(true);
      RememberClosed(it->first);
      reaped.push_back(it->second->name);
      it = jobs_.erase(it);
    } else {
      ++it;
    }
  }
  return reaped;
}

namespace {
constexpr int64_t kClosedMemoryNs = int64_t{60} * 1000 * 1000 * 1000;
constexpr size_t kClosedMemoryMax = 4096;
}  // namespace

void JobRegistry::RememberClosed(uint32_t job_id) {
  const int64_t now = MonotonicNanos();
  while (!closed_.empty() && (now - closed_.front().second > kClosedMemoryNs || closed_.size() >= kClosedMemoryMax)) {
    closed_.pop_front();
  }
  closed_.emplace_back(job_id, now);
}

bool JobRegistry::RecentlyClosed(uint32_t job_id) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  const int64_t now = MonotonicNanos();
  for (const auto& [id, when] : closed_) {
    if (id == job_id && now - when <= kClosedMemoryNs) return true;
  }
  return false;
}

std::shared_ptr<Job> JobRegistry::Find(uint32_t job_id) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second;
}

void JobRegistry::ExportMetrics(MetricsRegistry* metrics) {
  using K = MetricsRegistry::Kind;
  metrics->AddComputed("dlcp_jobs", {}, K::kGauge, "Jobs this aggregator serves", [this] {
    return static_cast<double>(List().size());
  });
  metrics->AddComputed("dlcp_workers", {}, K::kGauge, "Joined workers, over all jobs", [this] {
    double n = 0;
    for (const auto& j : List()) n += j->member_count.load();
    return n;
  });
  metrics->AddComputed("dlcp_accumulator_bytes", {}, K::kGauge,
                       "Accumulator memory the jobs' rounds hold, over all jobs (--max-memory-bytes caps it)",
                       [this] { return static_cast<double>(memory_->used()); });
  metrics->AddComputed("dlcp_accumulator_limit_bytes", {}, K::kGauge, "--max-memory-bytes",
                       [this] { return static_cast<double>(memory_->limit()); });
  metrics->AddComputed("dlcp_rounds_in_flight", {}, K::kGauge, "Open rounds, over all jobs and data threads", [this] {
    double n = 0;
    for (const auto& j : List()) n += j->rounds_in_flight.load();
    return n;
  });
  const std::string rotations = "Data-key rotations (docs/security.md): keys drawn, and rotations ended with the old key dropped";
  metrics->AddComputed("dlcp_data_key_rotations_total", {{"phase", "drawn"}}, K::kCounter, rotations,
                       [this] { return static_cast<double>(keys_drawn_.load(std::memory_order_relaxed)); });
  metrics->AddComputed("dlcp_data_key_rotations_total", {{"phase", "settled"}}, K::kCounter, rotations,
                       [this] { return static_cast<double>(keys_settled_.load(std::memory_order_relaxed)); });
}

void JobRegistry::ExportSlowestRanks(MetricsRegistry* metrics, uint32_t k) {
  if (k == 0) return;
  using K = MetricsRegistry::Kind;
  using Sample = MetricsRegistry::Sample;
  // Each reads every job's board, which sums up at most once a second however often it is scraped.
  auto slowest = [this, k](auto&& emit) {
    std::vector<Sample> out;
    for (const std::shared_ptr<Job>& job : List()) {
      for (const RankLateness& r : job->stragglers.Ranks(MonotonicNanos(), k)) emit(*job, r, &out);
    }
    return out;
  };
  metrics->AddComputedSamples(
      "dlcp_rank_lateness_seconds", K::kGauge,
      "How late a rank delivers its part of a round behind the job's first rank, over the last 128 rounds; "
      "the job's slowest ranks only (dlcpd --metrics-slowest-ranks)",
      [slowest] {
        return slowest([](const Job& job, const RankLateness& r, std::vector<Sample>* out) {
          const std::string rank = std::to_string(r.rank);
          out->push_back({{{"job", job.name}, {"rank", rank}, {"quantile", "0.5"}}, r.p50_us / 1e6, nullptr});
          out->push_back({{{"job", job.name}, {"rank", rank}, {"quantile", "0.99"}}, r.p99_us / 1e6, nullptr});
        });
      });
  metrics->AddComputedSamples(
      "dlcp_rank_lateness_mean_seconds", K::kGauge,
      "What a rank holds a round up by on average, over the last 128 rounds; the job's slowest ranks only", [slowest] {
        return slowest([](const Job& job, const RankLateness& r, std::vector<Sample>* out) {
          out->push_back({{{"job", job.name}, {"rank", std::to_string(r.rank)}}, r.mean_us / 1e6, nullptr});
        });
      });
  metrics->AddComputedSamples(
      "dlcp_rank_last_ratio", K::kGauge,
      "Share of the last 128 rounds in which a rank delivered last; the job's slowest ranks only", [slowest] {
        return slowest([](const Job& job, const RankLateness& r, std::vector<Sample>* out) {
          const double ratio = r.rounds == 0 ? 0 : static_cast<double>(r.last) / r.rounds;
          out->push_back({{{"job", job.name}, {"rank", std::to_string(r.rank)}}, ratio, nullptr});
        });
      });
}

size_t JobRegistry::size() const {
  std::shared_lock lock(mu_);
  return jobs_.size();
}

std::vector<std::shared_ptr<Job>> JobRegistry::List() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  std::vector<std::shared_ptr<Job>> out;
  for (const auto& [id, job] : jobs_) out.push_back(job);
  return out;
}

}  // namespace dlcp::server
