// One worker's side of its host stage's steps (common/shm/stage_layout.h). A step moves one
// slot's worth of one op: every member writes its part into its slot, each sums its share of the
// elements from every slot into slot 0, the first member runs the network leg on slot 0 (the
// host's sum goes to the aggregators and the job's sum comes back into it), and every member
// copies slot 0 out. Members run the same steps in the same order, as they run the same ops.
//
// Every way out of a step publishes each of its counters, so no member ever waits on another for
// a step that one has given up: it gives up too, or fails it, by its own deadline at the latest.
// A member whose process ended (dlcpd marks it gone) fails every step from then on, naming it.
//
// Threading: one thread drives it (HostStage's); `interrupted` may be set from any.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
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
};

// Where a step's part comes from and where its result goes. `in` writes this member's part
// (spec.elems values) into its slot, and is null where its part is not needed (a broadcast not
// from it); `out` reads the step's result from slot 0. Host memory is copied; a device tensor goes
// through the CUDA runtime. A failed copy fails the step on every member.
struct StepIo {
  std::function<absl::Status(float* slot)> in;
  std::function<absl::Status(const float* result)> out;
};
StepIo HostStepIo(const float* in, float* out, uint64_t elems);

// The first member's network leg: sums slot 0 (`elems` values) over the job's hosts, in place,
// blocking until done or failed.
using NetworkLeg = std::function<absl::Status(float* sum, const StepSpec& spec)>;

class StageSteps {
 public:
  explicit StageSteps(StageMembership membership) : m_(std::move(membership)) {}

  uint64_t slot_elems() const { return m_.welcome.slot_bytes / sizeof(float); }
  bool first() const { return m_.welcome.member == 0; }
  const std::vector<uint32_t>& ranks() const { return m_.welcome.ranks; }
  uint32_t rank_of(uint32_t member) const { return m_.welcome.ranks[member]; }
  // ABORTED naming a member whose process is gone (dlcpd said so); OK while every one is there.
  absl::Status Gone() const;
  // Closes this member's host socket: dlcpd then marks it gone, so the others stop waiting for
  // it. The region stays mapped (an engine op may still write into it).
  void Leave() { m_.socket = OwnedFd(); }

  // Runs the next step: every member's part, from `io.in`, summed over the members and handed to
  // `io.out`. `interrupted` ends its waits early with the status it returns (the client is
  // closing).
  absl::Status Run(const StepSpec& spec, const StepIo& io, const NetworkLeg& leg, absl::Time deadline,
                   const std::function<absl::Status()>& interrupted);
  // The same for host memory: `in` (nullptr where this member's part is not needed) into `out`.
  absl::Status Run(const StepSpec& spec, const float* in, float* out, const NetworkLeg& leg, absl::Time deadline,
                   const std::function<absl::Status()>& interrupted) {
    return Run(spec, HostStepIo(in, out, spec.elems), leg, deadline, interrupted);
  }
  // A bounded-loss step's losses: the first member posts them from its network leg (before the
  // step's result); the others read them while they read the result (in StepIo::out).
  void PostLoss(const StageLoss& loss, const std::vector<uint8_t>& classes);
  StageLoss loss() const;
  std::vector<uint8_t> classes() const;
  // The shared region, for pinning it (device tensors copy straight into it).
  void* region() const { return m_.region.data(); }
  size_t region_bytes() const { return m_.region.size(); }
  // Gives the next step up at once with `why` (the rest of an op that failed), publishing all of
  // it, so that every member goes through the same steps for each op and stays in step.
  absl::Status Skip(const StepSpec& spec, const absl::Status& why);

 private:
  using Counter = std::atomic<uint64_t> StageMember::*;
  StageHeader& header() const { return *static_cast<StageHeader*>(m_.region.data()); }
  float* slot(uint32_t member) const;
  uint32_t members() const { return static_cast<uint32_t>(m_.welcome.ranks.size()); }
  StageMember& mine() const { return header().member[m_.welcome.member]; }
  void Publish(Counter counter, uint64_t step);
  void WriteSpec(uint64_t step, const StepSpec& spec);  // this member's descriptor of `step`
  // Sleeps on the bell until `ready()`; a gone member (or what one noticed), `interrupted()`, or
  // `late()` once `deadline` passes end it sooner.
  absl::Status WaitUntil(const std::function<bool()>& ready, absl::Time deadline,
                         const std::function<absl::Status()>& interrupted,
                         const std::function<absl::Status()>& late) const;
  // Until every member's `counter` reaches `step`; DEADLINE_EXCEEDED names the ranks still missing.
  absl::Status WaitAll(Counter counter, uint64_t step, absl::Time deadline, const char* what,
                       const std::function<absl::Status()>& interrupted) const;
  // Until the first member posts `step`'s result; what it posted.
  absl::Status WaitResult(uint64_t step, absl::Time deadline, const std::function<absl::Status()>& interrupted) const;
  // Every member's spec of this step is `spec`, and none gave the step up.
  absl::Status Agree(const StepSpec& spec, uint64_t step) const;
  void Share(const StepSpec& spec);  // this member's share of slot 0
  absl::Status Lead(uint64_t step, const StepSpec& spec, const NetworkLeg& leg, absl::Time deadline,
                    const std::function<absl::Status()>& interrupted);
  void PostResult(uint64_t step, const absl::Status& status);
  // The first member to give up `step` says why (StageNotice); Noticed is what it said, if any.
  void Notify(uint64_t step, const absl::Status& why);
  absl::Status Noticed(uint64_t step) const;
  // Gone(), unless a member said why it gave this step up: then that.
  absl::Status GoneOrNoticed() const;
  absl::Status Finish(uint64_t step, const absl::Status& status);  // publishes what is left; returns `status`

  StageMembership m_;
  uint64_t step_ = 0;
};

}  // namespace dlcp
