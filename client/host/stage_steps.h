// One worker's side of its host stage's steps (common/shm/stage_layout.h). A step moves one
// slot's worth of one op: every member writes its part into its slot, each sums its share of the
// elements from every slot into the step's bank (a sum slot), the first member runs the network
// leg on that bank (the host's sum goes to the aggregators and the job's sum comes back into it),
// and every member copies the bank out. Members run the same steps in the same order, as they run
// the same ops.
//
// A step is begun (Begin) and later ended (End), and later steps may begin in between: the
// members copy in and sum step s + 1 into the next bank while the first member's network leg of
// step s still runs, and legs of different keys run side by side. So at most kStageBanks steps
// are under way: Begin(s + kStageBanks) waits until every member has ended step s.
//
// Every way out of a step publishes each of its counters, so no member ever waits on another for
// a step that one has given up: it gives up too, or fails it, by its own deadline at the latest.
// A member whose process ended (dlcpd marks it gone) fails every step from then on, naming it.
//
// Threading: one thread begins steps (Begin, GiveUpStep) and one thread, the same or another,
// ends them (End), in the order they were begun; `interrupted` may be set from any, and a network
// leg ends (LegDone) on any.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/host/stage_join.h"
#include "common/shm/stage_layout.h"

namespace dlcp {

struct StepSpec {
  uint32_t key = 0;
  uint32_t kind = 0;  // 0: all-reduce; 1 + root: broadcast from rank `root`
  uint64_t offset = 0;  // of this step's part in the tensor, in elements
  uint64_t elems = 0;
  uint64_t tensor_elems = 0;
  uint32_t loss_bound_ppm = 0;  // the op's ε: members must agree on it too
  // Nothing is summed: the first member's leg writes the op's result into the step's bank (the
  // result of an op whose network round ran over the whole tensor, HostStage).
  bool result_only = false;
};

// Where a step's part comes from and where its result goes. `in` writes this member's part
// (spec.elems values) into its slot, and is null where its part is not needed (a broadcast not
// from it); `out` reads the step's result from its sum slot. Host memory is copied; a device tensor goes
// through the CUDA runtime. A failed copy fails the step on every member.
struct StepIo {
  std::function<absl::Status(float* slot)> in;
  std::function<absl::Status(const float* result)> out;
};
StepIo HostStepIo(const float* in, float* out, uint64_t elems);

// Ends a network leg: runs once, on any thread.
using LegDone = std::function<void(const absl::Status&)>;
// The first member's network leg of step `step`: sums `sum` (spec.elems values) over the job's
// hosts, in place, then calls `done`. `sum` is the leg's until then. It may call `done` before it
// returns.
using NetworkLeg = std::function<void(float* sum, const StepSpec& spec, uint64_t step, LegDone done)>;

// A step begun: its number, and how it went so far (not OK: it is given up, and End only frees it).
struct BegunStep {
  uint64_t step = 0;
  absl::Status status;
  absl::Time gathered;  // when this member saw every member's part in (for the timeline)
  bool led = false;     // the first member started the step's network leg
};

class StageSteps {
 public:
  explicit StageSteps(StageMembership membership) : m_(std::move(membership)) {}

  uint64_t slot_elems() const { return m_.welcome.slot_bytes / sizeof(float); }
  bool first() const { return m_.welcome.member == 0; }
  uint32_t member() const { return m_.welcome.member; }
  const std::vector<uint32_t>& ranks() const { return m_.welcome.ranks; }
  uint32_t rank_of(uint32_t member) const { return m_.welcome.ranks[member]; }
  // ABORTED naming a member whose process is gone (dlcpd said so); OK while every one is there.
  absl::Status Gone() const;
  // Closes this member's host socket: dlcpd then marks it gone, so the others stop waiting for
  // it. The region stays mapped (an engine op may still write into it).
  void Leave() { m_.socket = OwnedFd(); }

  // Begins the next step: once its bank and this member's slot are free, writes this member's part
  // (`io.in`) and sums its share of the members' parts into the bank; the first member then starts
  // `leg` on the bank (after the last leg of the same key ended: a key has one op in flight).
  // Blocks while kStageBanks steps are under way, until the oldest has ended on every member.
  // `interrupted` ends its waits early with the status it returns (the client is closing).
  BegunStep Begin(const StepSpec& spec, const StepIo& io, const NetworkLeg& leg, absl::Time deadline,
                  const std::function<absl::Status()>& interrupted);
  // Ends step `begun`, the oldest not ended: waits for its result and hands it to `out`, unless it
  // was given up, then frees its bank. Returns how it went. The first member waits for its network
  // leg to end even with a member gone (`interrupted` should then say only that it is closing):
  // the engine may write into the bank until then.
  absl::Status End(const BegunStep& begun, const std::function<absl::Status(const float* result)>& out,
                   absl::Time deadline, const std::function<absl::Status()>& interrupted);
  // Begin, then End: every member's part, from `io.in`, summed over the members and handed to
  // `io.out`.
  absl::Status Run(const StepSpec& spec, const StepIo& io, const NetworkLeg& leg, absl::Time deadline,
                   const std::function<absl::Status()>& interrupted) {
    return End(Begin(spec, io, leg, deadline, interrupted), io.out, deadline, interrupted);
  }
  // The same for host memory: `in` (nullptr where this member's part is not needed) into `out`.
  absl::Status Run(const StepSpec& spec, const float* in, float* out, const NetworkLeg& leg, absl::Time deadline,
                   const std::function<absl::Status()>& interrupted) {
    return Run(spec, HostStepIo(in, out, spec.elems), leg, deadline, interrupted);
  }
  // A bounded-loss step's losses: the first member posts them from its network leg (before it
  // ends); the others read them while they read the result (in End's `out`). Any thread.
  void PostLoss(uint64_t step, const StageLoss& loss, const std::vector<uint8_t>& classes);
  StageLoss loss(uint64_t step) const;
  std::vector<uint8_t> classes(uint64_t step) const;
  // When each member came to step `begun` (in member order), ready to write its part: how late
  // each one is. Valid from Begin's return (OK) until this member ends the step.
  std::vector<absl::Time> Came(const BegunStep& begun) const;
  // Wakes every member's wait, to look at `interrupted` again. Any thread.
  void Wake() const;
  // The shared region, for pinning it (device tensors copy straight into it).
  void* region() const { return m_.region.data(); }
  size_t region_bytes() const { return m_.region.size(); }
  // Begins the next step given up at once with `why` (the rest of an op that failed), publishing
  // all of it, so that every member goes through the same steps for each op and stays in step.
  // End it as any other.
  BegunStep GiveUpStep(const StepSpec& spec, const absl::Status& why, absl::Time deadline,
                       const std::function<absl::Status()>& interrupted);
  // GiveUpStep, then End: returns `why`.
  absl::Status Skip(const StepSpec& spec, const absl::Status& why, absl::Time deadline,
                    const std::function<absl::Status()>& interrupted) {
    return End(GiveUpStep(spec, why, deadline, interrupted), nullptr, deadline, interrupted);
  }

 private:
  using Counter = std::atomic<uint64_t> StageMember::*;
  using Interrupted = std::function<absl::Status()>;
  StageHeader& header() const { return *static_cast<StageHeader*>(m_.region.data()); }
  float* slot(uint32_t member) const;
  float* bank(uint64_t step) const { return slot(members() + step % kStageBanks); }
  StageResult& result(uint64_t step) const { return header().result[step % kStageBanks]; }
  uint32_t members() const { return static_cast<uint32_t>(m_.welcome.ranks.size()); }
  StageMember& mine() const { return header().member[m_.welcome.member]; }
  void Publish(Counter counter, uint64_t step);
  void WriteSpec(uint64_t step, const StepSpec& spec);  // this member's descriptor of `step`
  // Sleeps on `bell` (the header's bell or result_bell) until `ready()`; a gone member (or what
  // it noticed) unless `heed_members` is false, `interrupted()`, or `late()` once `deadline`
  // passes end it sooner.
  absl::Status WaitUntil(std::atomic<uint32_t>& bell, const std::function<bool()>& ready, absl::Time deadline,
                         const Interrupted& interrupted, const std::function<absl::Status()>& late,
                         bool heed_members = true) const;
  // Until every member's `counter` reaches `at`; DEADLINE_EXCEEDED names the ranks still missing.
  absl::Status WaitAll(Counter counter, uint64_t at, absl::Time deadline, const char* what,
                       const Interrupted& interrupted) const;
  // Until the first member posts `step`'s result; what it posted. `own_leg`: this member started
  // the step's leg, whose end it waits for even with a member gone.
  absl::Status WaitResult(uint64_t step, bool own_leg, absl::Time deadline, const Interrupted& interrupted) const;
  // Every member's spec of this step is `spec`, and none gave the step up. A record that no
  // worker can have written (this worker's own changed, another's at another step unmarked) is
  // DATA_LOSS: the region was damaged, and no rank is blamed.
  absl::Status Agree(const StepSpec& spec, uint64_t step) const;
  absl::Status OwnRecordIntact(const StepSpec& spec, uint64_t step) const;
  void Share(const StepSpec& spec, uint64_t step);  // this member's share of the step's bank
  // The first member: once every share is in, starts the leg (or posts why not). True where it
  // started one.
  bool Lead(uint64_t step, const StepSpec& spec, const NetworkLeg& leg, absl::Time deadline,
            const Interrupted& interrupted);
  // Until the last leg of `key` before `step` ended (the engine runs one op of a key at a time).
  absl::Status AwaitLegOf(uint32_t key, uint64_t step, absl::Time deadline, const Interrupted& interrupted);
  // Blocks until every member has ended the step that used `step`'s bank before it.
  absl::Status AwaitBank(uint64_t step, absl::Time deadline, const Interrupted& interrupted) const;
  void PostResult(uint64_t step, const absl::Status& status);
  // Says why `step` failed here, unless a member said it first (StageNotice).
  void Notify(uint64_t step, const absl::Status& why);
  // This member gives `step` up: marks it, and says why.
  void GiveUp(uint64_t step, const absl::Status& why);
  absl::Status Noticed(uint64_t step) const;
  // Gone(), unless a gone member (or another) said why the step it last came to failed: then that.
  absl::Status GoneOrNoticed() const;

  StageMembership m_;
  uint64_t step_ = 0;  // the last step begun
  // The first member's last network leg of each key whose leg may still run: its step. The
  // beginning thread's.
  std::map<uint32_t, uint64_t> legs_;
};

}  // namespace dlcp
