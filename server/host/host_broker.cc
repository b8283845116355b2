#include "server/host/host_broker.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <list>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/clock.h"
#include "common/base/log.h"
#include "common/base/syscall.h"
#include "common/shm/descriptor_passing.h"
#include "common/shm/futex_bell.h"
#include "common/shm/host_hello.h"
#include "common/shm/shared_region.h"
#include "common/shm/stage_layout.h"

namespace dlcp::server {
namespace {

constexpr absl::Duration kHelloTimeout = absl::Seconds(5);
// Connections at once: a local process that opens more is not served past this (each costs a
// descriptor and a poll entry until its hello, or its 5 s, is up).
constexpr size_t kMaxConnections = 4096;
// After a stage failed to gather, its job's late workers take the network path too, like the rest.
constexpr absl::Duration kRememberRefusal = absl::Minutes(5);

absl::StatusOr<OwnedFd> Listen(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("--host-socket ", path, " is longer than ",
                                                   sizeof(addr.sun_path) - 1, " bytes"));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  OwnedFd probe(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (::connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--host-socket ", path, " is served by another process (another dlcpd on this host?)"));
  }
  ::unlink(path.c_str());  // a socket file left by a dlcpd that died
  OwnedFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (fd.get() < 0) return ErrnoToStatus(errno, "socket(AF_UNIX)");
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoToStatus(errno, absl::StrCat("--host-socket ", path, ": bind"));
  }
  ::chmod(path.c_str(), 0666);  // any local user may ask; SO_PEERCRED decides per stage
  if (::listen(fd.get(), 128) != 0) return ErrnoToStatus(errno, "listen on the host socket");
  return fd;
}

}  // namespace

class HostBrokerLoop {
 public:
  HostBrokerLoop(const HostBrokerOptions& options, OwnedFd listener, MetricsRegistry* metrics)
      : options_(options), listener_(std::move(listener)), stop_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    formed_ = metrics->GetCounter("dlcp_host_stages_formed_total", {}, "Host stages formed on this host's socket");
    refused_count_ = metrics->GetCounter("dlcp_host_stage_refusals_total", {},
                                         "Workers told to take the network path instead of a host stage");
    metrics->AddComputed("dlcp_host_shm_bytes", {}, MetricsRegistry::Kind::kGauge,
                         "Shared memory held by host stages (--host-shm-bytes bounds it)",
                         [this] { return static_cast<double>(shm_in_use_.load()); });
  }
  void Run();
  void Stop() {
    uint64_t one = 1;
    (void)!::write(stop_.get(), &one, sizeof(one));
  }

 private:
  struct Connection {
    OwnedFd fd;
    PeerCredentials peer;
    absl::Time hello_deadline;
    std::string job;  // empty until its hello
    uint32_t rank = 0;
  };

  // The workers of one job on this host: gathering until local_size have come, then formed.
  struct Stage {
    uint32_t world = 0;
    uint32_t local_size = 0;
    absl::Time deadline = absl::InfiniteFuture();  // set by the first member that waits (not on standby)
    std::map<uint32_t, int> members;  // rank -> connection; a formed stage keeps the gone ones as -1
    std::set<uint32_t> standby;       // members that asked on standby (HostHello::standby)
    std::optional<SharedRegion> region;  // set once formed
    bool formed() const { return region.has_value(); }
    StageHeader* header() const { return static_cast<StageHeader*>(region->data()); }
    bool holds(uint32_t rank, int fd) const {
      auto m = members.find(rank);
      return m != members.end() && m->second == fd;
    }
  };

  void Accept();
  void Serve(int fd, absl::Time now);
  // A stage belongs to its job's name and to its workers' uid (SO_PEERCRED): a worker of another
  // uid asking for a job of the same name gathers a stage of its own, so that a stranger can
  // neither join a job's stage nor block it, and its refusals are its own.
  using StageKey = std::pair<uid_t, std::string>;
  void OnHello(Connection& c, const HostHello& hello, absl::Time now);
  absl::Status Admit(const Connection& c, const HostHello& hello, Stage& stage) const;
  void Form(const StageKey& key, Stage& stage);
  // The slot size of a stage of `members` that fits what --host-shm-bytes has left: --host-slot-bytes,
  // else the largest that fits, at least MinSlotBytes(); 0 where none does.
  uint64_t SlotBytesFor(uint32_t members) const;
  uint64_t MinSlotBytes() const { return MinStageSlotBytes(options_.slot_bytes); }
  void Refuse(int fd, absl::StatusCode code, const std::string& reason);
  void Gone(int fd);
  // A formed stage's member is gone: the others hear it through the region. Returns how many live on.
  uint32_t MarkGone(Stage& stage, uint32_t rank);
  // The job's gathering workers whose connections hung up but are not yet served: gone first, so
  // that a worker restarted in the place of one is not refused as a second worker of its rank, and
  // no stage forms with a worker already gone.
  void DropHungUp(const StageKey& key);
  // Why a stage of `key` could not gather: the workers that came, and those of other uids that
  // asked for a job of its name.
  std::string GatherFailure(const StageKey& key, const Stage& stage) const;
  void Expire(absl::Time now);
  absl::Time NextDeadline() const;
  void CloseConnection(int fd) { connections_.erase(fd); }

  HostBrokerOptions options_;
  OwnedFd listener_;
  OwnedFd stop_;
  std::map<int, Connection> connections_;
  std::map<StageKey, Stage> stages_;  // gathering, or formed with every member there
  // Formed stages that lost a member: no op can go through them any more, so their job may gather
  // the next one meanwhile (its workers there ask on standby). Kept until their last member leaves.
  std::list<Stage> retired_;
  std::map<StageKey, std::pair<std::string, absl::Time>> refused_;  // (why, until when)
  std::atomic<uint64_t> shm_in_use_{0};
  Counter* formed_;
  Counter* refused_count_;
};

void HostBrokerLoop::Run() {
  for (;;) {
    std::vector<pollfd> fds{{listener_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}};
    for (const auto& [fd, c] : connections_) fds.push_back({fd, POLLIN, 0});
    const absl::Duration wait = std::clamp(NextDeadline() - MonotonicNow(), absl::ZeroDuration(), absl::Seconds(1));
    if (::poll(fds.data(), fds.size(), static_cast<int>(absl::ToInt64Milliseconds(wait)) + 1) < 0 && errno != EINTR) {
      DLCP_LOG(Error) << "host socket: poll: " << std::strerror(errno);
      return;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents & POLLIN) Accept();
    const absl::Time now = MonotonicNow();
    for (size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents != 0) Serve(fds[i].fd, now);
    }
    Expire(now);
  }
}

void HostBrokerLoop::Accept() {
  for (;;) {
    OwnedFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (fd.get() < 0) return;  // EAGAIN, or a connection reset before it was taken
    if (connections_.size() >= kMaxConnections) {
      Refuse(fd.get(), absl::StatusCode::kResourceExhausted,
             absl::StrCat("dlcpd's host socket serves ", kMaxConnections, " connections at most"));
      continue;
    }
    absl::StatusOr<PeerCredentials> peer = PeerOf(fd.get());
    if (!peer.ok()) continue;
    const int raw = fd.get();
    connections_[raw] = Connection{std::move(fd), *peer, MonotonicNow() + kHelloTimeout};
  }
}

void HostBrokerLoop::Serve(int fd, absl::Time now) {
  auto it = connections_.find(fd);
  if (it == connections_.end()) return;
  absl::StatusOr<ReceivedMessage> m = ReceiveWithDescriptors(fd, kMaxHostMessageBytes, now);
  if (!m.ok()) {
    if (absl::IsDeadlineExceeded(m.status())) return;
    return Gone(fd);  // closed, or a message cut short: either way this worker is done here
  }
  if (!it->second.job.empty()) return Gone(fd);  // only one hello per connection
  absl::StatusOr<HostHello> hello = DecodeHostHello(m->message);
  if (!hello.ok()) {
    Refuse(fd, hello.status().code(), std::string(hello.status().message()));
    return CloseConnection(fd);
  }
  OnHello(it->second, *hello, now);
}

absl::Status HostBrokerLoop::Admit(const Connection& c, const HostHello& h, Stage& stage) const {
  if (stage.world != h.world_size || stage.local_size != h.local_size) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", h.job_name, "' on this host has world_size ", stage.world, " and local_size ",
                     stage.local_size, "; rank ", h.rank, " says ", h.world_size, " and ", h.local_size));
  }
  if (stage.formed()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", h.job_name, "' already has its host stage on this host; rank ", h.rank,
                     " came after it formed (a restarted worker?)"));
  }
  if (stage.members.count(h.rank) != 0) {
    const auto other = connections_.find(stage.members.at(h.rank));
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", h.rank, " of job '", h.job_name, "' is already at this host's stage (pid ",
        other != connections_.end() ? other->second.peer.pid : 0, "); every worker needs a rank of its own"));
  }
  return absl::OkStatus();
}

void HostBrokerLoop::OnHello(Connection& c, const HostHello& h, absl::Time now) {
  const int fd = c.fd.get();
  const StageKey key{c.peer.uid, h.job_name};
  if (auto r = refused_.find(key); r != refused_.end() && now < r->second.second) {
    Refuse(fd, absl::StatusCode::kDeadlineExceeded, r->second.first);
    return CloseConnection(fd);
  }
  DropHungUp(key);
  auto [it, fresh] = stages_.try_emplace(key);
  Stage& stage = it->second;
  if (fresh) {
    stage.world = h.world_size;
    stage.local_size = h.local_size;
  }
  if (absl::Status ok = Admit(c, h, stage); !ok.ok()) {
    Refuse(fd, ok.code(), std::string(ok.message()));
    CloseConnection(fd);
    if (stage.members.empty()) stages_.erase(it);
    return;
  }
  c.job = h.job_name;
  c.rank = h.rank;
  stage.members[h.rank] = fd;
  if (h.standby) {
    stage.standby.insert(h.rank);
  } else if (stage.deadline == absl::InfiniteFuture()) {
    stage.deadline = now + options_.gather_timeout;
  }
  if (stage.members.size() == stage.local_size) Form(key, stage);
}

void HostBrokerLoop::DropHungUp(const StageKey& key) {
  auto s = stages_.find(key);
  if (s == stages_.end() || s->second.formed()) return;
  std::vector<int> hung_up;
  for (const auto& [rank, fd] : s->second.members) {
    pollfd p{fd, POLLRDHUP, 0};
    if (::poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) hung_up.push_back(fd);
  }
  for (int fd : hung_up) Gone(fd);
}

uint64_t HostBrokerLoop::SlotBytesFor(uint32_t members) const {
  const uint64_t in_use = shm_in_use_.load();
  const uint64_t left = options_.shm_bytes > in_use ? options_.shm_bytes - in_use : 0;
  if (StageRegionBytes(members, options_.slot_bytes) <= left) return options_.slot_bytes;
  // A stage of many workers takes smaller slots, in whole pages, rather than none: its ops then go
  // in more steps, down to MinSlotBytes().
  const uint64_t fits = left > kStageSlotsOffset ? (left - kStageSlotsOffset) / (members + kStageBanks) : 0;
  const uint64_t slot = fits & ~uint64_t{4095};
  return slot >= MinSlotBytes() ? slot : 0;
}

void HostBrokerLoop::Form(const StageKey& key, Stage& stage) {
  const std::string& job = key.second;
  const uint64_t slot_bytes = SlotBytesFor(stage.local_size);
  const uint64_t bytes = StageRegionBytes(stage.local_size, slot_bytes == 0 ? MinSlotBytes() : slot_bytes);
  std::optional<absl::Status> refusal;
  if (slot_bytes == 0) {
    refusal = absl::ResourceExhaustedError(absl::StrCat(
        "the host stage of job '", job, "' needs ", bytes, " bytes of shared memory even with slots of ",
        MinSlotBytes(), " bytes; this host's stages hold ", shm_in_use_.load(), " of dlcpd --host-shm-bytes=",
        options_.shm_bytes));
  } else if (absl::StatusOr<SharedRegion> region = SharedRegion::Create("stage-" + job, bytes); !region.ok()) {
    refusal = region.status();
  } else {
    stage.region = std::move(*region);
  }
  if (refusal) {
    DLCP_LOG(Warning) << *refusal;
    for (const auto& [rank, fd] : stage.members) {
      Refuse(fd, refusal->code(), std::string(refusal->message()));
      CloseConnection(fd);
    }
    stages_.erase(key);
    return;
  }
  shm_in_use_ += bytes;
  StageHeader* h = new (stage.header()) StageHeader{};
  h->magic = kStageMagic;
  h->version = kStageVersion;
  h->members = stage.local_size;
  h->slot_bytes = slot_bytes;
  formed_->Add();
  HostWelcome w;
  w.slot_bytes = slot_bytes;
  for (const auto& [rank, fd] : stage.members) w.ranks.push_back(rank);
  // Those on standby first: their answer is then in their socket before the others can act on
  // theirs (the others' next step is to join the job, which tells the standby ones to go on).
  for (bool standby : {true, false}) {
    w.member = 0;
    for (const auto& [rank, fd] : stage.members) {
      if (stage.standby.count(rank) == (standby ? 1u : 0u) &&
          !SendWithDescriptors(fd, EncodeHostWelcome(w), {stage.region->fd()}).ok()) {
        h->gone[w.member].store(1);
      }
      ++w.member;
    }
  }
  DLCP_LOG(Info) << "host stage of job " << job << (stage.standby.empty() ? "" : " formed again") << ": ranks "
                 << absl::StrJoin(w.ranks, ",") << ", " << (bytes >> 20) << " MiB shared";
}

void HostBrokerLoop::Refuse(int fd, absl::StatusCode code, const std::string& reason) {
  refused_count_->Add();
  HostWelcome w;
  w.code = code;
  w.reason = reason;
  (void)SendWithDescriptors(fd, EncodeHostWelcome(w), {});  // a peer that is gone needs no answer
}

void HostBrokerLoop::Gone(int fd) {
  auto c = connections_.find(fd);
  if (c == connections_.end()) return;
  const std::string job = c->second.job;
  const uint32_t rank = c->second.rank;
  const pid_t pid = c->second.peer.pid;
  const uid_t uid = c->second.peer.uid;
  CloseConnection(fd);
  if (job.empty()) return;
  if (auto s = stages_.find(StageKey{uid, job}); s != stages_.end() && s->second.holds(rank, fd)) {
    Stage& stage = s->second;
    if (!stage.formed()) {
      stage.members.erase(rank);
      stage.standby.erase(rank);
      if (stage.members.empty()) stages_.erase(s);
      return;
    }
    DLCP_LOG(Info) << "job " << job << " rank " << rank << " (pid " << pid << ") left its host stage";
    retired_.push_back(std::move(stage));  // its first member gone: the job may gather the next one
    stages_.erase(s);
  }
  for (auto r = retired_.begin(); r != retired_.end(); ++r) {
    if (!r->holds(rank, fd)) continue;
    if (MarkGone(*r, rank) == 0) {  // its last member gone: its memory with it
      shm_in_use_ -= r->region->size();
      retired_.erase(r);
    }
    return;
  }
}

uint32_t HostBrokerLoop::MarkGone(Stage& stage, uint32_t rank) {
  uint32_t index = 0, live = 0;
  for (auto& [r, member_fd] : stage.members) {
    if (r == rank) {
      member_fd = -1;
      stage.header()->gone[index].store(1);
      RingBell(stage.header()->bell);  // every wait looks at `gone`
      RingBell(stage.header()->result_bell);
    }
    live += member_fd >= 0;
    ++index;
  }
  return live;
}

void HostBrokerLoop::Expire(absl::Time now) {
  for (auto it = connections_.begin(); it != connections_.end();) {
    const bool silent = it->second.job.empty() && now >= it->second.hello_deadline;
    it = silent ? connections_.erase(it) : std::next(it);
  }
  for (auto it = stages_.begin(); it != stages_.end();) {
    Stage& stage = it->second;
    if (stage.formed() || now < stage.deadline) {
      ++it;
      continue;
    }
    const std::string why = GatherFailure(it->first, stage);
    DLCP_LOG(Warning) << why;
    for (const auto& [rank, fd] : stage.members) {
      Refuse(fd, absl::StatusCode::kDeadlineExceeded, why);
      CloseConnection(fd);
    }
    refused_[it->first] = {why, now + kRememberRefusal};
    it = stages_.erase(it);
  }
  std::erase_if(refused_, [now](const auto& r) { return now >= r.second.second; });
}

std::string HostBrokerLoop::GatherFailure(const StageKey& key, const Stage& stage) const {
  std::string why = absl::StrCat("only ", stage.members.size(), " of the ", stage.local_size, " workers of job '",
                                 key.second, "' of uid ", key.first, " on this host came to its host stage within ",
                                 absl::FormatDuration(options_.gather_timeout),
                                 " (dlcpd --host-gather-timeout-ms); they take the network path");
  for (const auto& [other, other_stage] : stages_) {
    if (other.second != key.second || other.first == key.first) continue;
    absl::StrAppend(&why, "; ", other_stage.members.size(), " worker(s) of uid ", other.first,
                    " asked for a stage of a job of that name: a job's workers on one host must run as one user, "
                    "and a stage is never shared between users");
  }
  return why;
}

absl::Time HostBrokerLoop::NextDeadline() const {
  absl::Time next = absl::InfiniteFuture();
  for (const auto& [fd, c] : connections_) {
    if (c.job.empty()) next = std::min(next, c.hello_deadline);
  }
  for (const auto& [key, stage] : stages_) {
    if (!stage.formed()) next = std::min(next, stage.deadline);
  }
  return next;
}

absl::StatusOr<std::unique_ptr<HostBroker>> HostBroker::Start(const HostBrokerOptions& options,
                                                              MetricsRegistry* metrics) {
  absl::StatusOr<OwnedFd> listener = Listen(options.socket_path);
  if (!listener.ok()) return listener.status();
  std::unique_ptr<HostBroker> broker(new HostBroker());
  broker->path_ = options.socket_path;
  struct stat st{};
  if (::stat(options.socket_path.c_str(), &st) == 0) broker->inode_ = st.st_ino;
  broker->loop_ = std::make_unique<HostBrokerLoop>(options, std::move(*listener), metrics);
  broker->thread_ = std::thread([loop = broker->loop_.get()] { loop->Run(); });
  DLCP_LOG(Info) << "host stages served on " << options.socket_path;
  return broker;
}

HostBroker::~HostBroker() {
  loop_->Stop();
  thread_.join();
  struct stat st{};
  if (::stat(path_.c_str(), &st) == 0 && st.st_ino == inode_) ::unlink(path_.c_str());
}

}  // namespace dlcp::server
