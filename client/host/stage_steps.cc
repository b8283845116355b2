#include "client/host/stage_steps.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/clock.h"
#include "common/shm/futex_bell.h"
#include "common/wire/bounded.h"
#include "common/reduce/sum.h"

namespace dlcp {
namespace {

constexpr absl::Duration kResultGrace = absl::Seconds(5);
// StageMember::kind's high bit: a StepSpec::result_only step (roots are ranks, far below it).
constexpr uint32_t kResultOnly = uint32_t{1} << 31;

uint32_t KindOf(const StepSpec& s) { return s.kind | (s.result_only ? kResultOnly : 0); }

// What a member says of the op of the step it came to last (StageMember's own fields), as read.
struct OpRecord {
  uint64_t step = 0;
  uint32_t key = 0;
  uint32_t kind = 0;
  uint64_t offset = 0;
  uint64_t elems = 0;
  uint64_t tensor_elems = 0;
  uint32_t loss_bound_ppm = 0;
  bool operator==(const OpRecord&) const = default;
};

OpRecord RecordOf(const StageMember& m) {
  return {m.step, m.key, m.kind, m.offset, m.elems, m.tensor_elems, m.loss_bound_ppm};
}

OpRecord RecordOf(const StepSpec& s, uint64_t step) {
  return {step, s.key, KindOf(s), s.offset, s.elems, s.tensor_elems, s.loss_bound_ppm};
}

std::string Describe(const OpRecord& m) {
  const uint32_t kind = m.kind & ~kResultOnly;
  const std::string what = kind == 0 ? "an all-reduce" : absl::StrCat("a broadcast from rank ", kind - 1);
  const std::string bound =
      m.loss_bound_ppm == 0 ? "" : absl::StrCat(", loss bound ", static_cast<double>(m.loss_bound_ppm) / wire::kPpm);
  const std::string part = (m.kind & kResultOnly) != 0 ? ", its result" : "";
  return absl::StrCat(what, " of key ", m.key, " (", m.tensor_elems, " elements", bound, part, ")");
}

// Member `i`'s share of `n` elements: whole cache lines, the last member taking the rest.
std::pair<uint64_t, uint64_t> ShareOf(uint32_t i, uint32_t members, uint64_t n) {
  auto edge = [&](uint32_t k) { return k == members ? n : (n * k / members) & ~uint64_t{15}; };
  return {edge(i), edge(i + 1)};
}

// What the other members read: the code, and as much of the message as fits.
void WriteStatus(const absl::Status& status, StageStatus* out) {
  out->code = static_cast<int32_t>(status.code());
  const absl::string_view message = status.message();
  out->message_len = static_cast<uint32_t>(std::min<size_t>(message.size(), kStageMessageBytes));
  if (out->message_len > 0) std::memcpy(out->message, message.data(), out->message_len);
}

// A status another member wrote, which may hold anything: an unknown code reads as UNKNOWN.
absl::Status ReadStatus(const StageStatus& in) {
  if (in.code == 0) return absl::OkStatus();
  const auto code = static_cast<absl::StatusCode>(std::clamp(in.code, 1, 16));
  return absl::Status(code, std::string(in.message, std::min(in.message_len, kStageMessageBytes)));
}

}  // namespace

float* StageSteps::slot(uint32_t member) const {
  return reinterpret_cast<float*>(static_cast<char*>(m_.region.data()) + kStageSlotsOffset +
                                  member * m_.welcome.slot_bytes);
}

void StageSteps::Publish(Counter counter, uint64_t step) {
  std::atomic<uint64_t>& c = mine().*counter;
  if (c.load(std::memory_order_relaxed) < step) c.store(step, std::memory_order_seq_cst);
  // Only a member that completes the step's count rings: every wait on these counters waits for
  // all members (WaitAll), and a bell rung by each of L members would wake the L - 1 sleepers each
  // time, L² wake-ups a counter a step, which on a host with fewer cores than workers was most of
  // a round. Sequentially consistent: of members that publish at once, the last one's loads see
  // the others' stores, so one of them rings.
  for (uint32_t i = 0; i < members(); ++i) {
    if ((header().member[i].*counter).load(std::memory_order_seq_cst) < step) return;
  }
  RingBell(header().bell);
}

void StageSteps::Wake() const {
  RingBell(header().bell);
  RingBell(header().result_bell);
}

absl::Status StageSteps::Gone() const {
  for (uint32_t i = 0; i < members(); ++i) {
    if (header().gone[i].load(std::memory_order_acquire) != 0) {
      return absl::AbortedError(absl::StrCat("worker rank ", rank_of(i),
                                             " of this host's stage is gone (its process ended or closed its client)"));
    }
  }
  return absl::OkStatus();
}

void StageSteps::Notify(uint64_t step, const absl::Status& why) {
  StageNotice& n = header().notice[step % kStageBanks];
  uint64_t claimed = n.claimed.load(std::memory_order_acquire);
  while (claimed < step && !n.claimed.compare_exchange_weak(claimed, step, std::memory_order_acq_rel)) {
  }
  if (claimed >= step) return;  // another member said it first
  WriteStatus(why, &n.status);
  n.step.store(step, std::memory_order_release);
  Wake();  // waits of both kinds look at the notices
}

void StageSteps::GiveUp(uint64_t step, const absl::Status& why) {
  Notify(step, why);  // first: the first member reads why once it sees the mark
  mine().abandoned[step % kStageBanks].store(step, std::memory_order_release);
  Wake();
}

absl::Status StageSteps::Noticed(uint64_t step) const {
  const StageNotice& n = header().notice[step % kStageBanks];
  if (n.step.load(std::memory_order_acquire) != step) return absl::OkStatus();
  return ReadStatus(n.status);
}

absl::Status StageSteps::GoneOrNoticed() const {
  absl::Status gone = Gone();
  if (gone.ok()) return gone;
  // Why a member gave up the step it last came to, or one of those before it still under way
  // (which it ends after it begins the next): a worker that leaves over a failed op is not blamed
  // for leaving.
  uint64_t last = UINT64_MAX;
  for (uint32_t i = 0; i < members(); ++i) {
    if (header().gone[i].load(std::memory_order_acquire) != 0) {
      last = std::min(last, header().member[i].arrived.load(std::memory_order_acquire));
    }
  }
  uint64_t latest = 0;
  for (const StageNotice& n : header().notice) {
    const uint64_t step = n.step.load(std::memory_order_acquire);
    if (step != 0 && step + kStageBanks > last && step > latest) latest = step;
  }
  if (latest == 0) return gone;
  absl::Status noticed = Noticed(latest);
  return noticed.ok() ? gone : noticed;
}

absl::Status StageSteps::WaitUntil(std::atomic<uint32_t>& bell, const std::function<bool()>& ready,
                                   absl::Time deadline, const Interrupted& interrupted,
                                   const std::function<absl::Status()>& late, bool heed_members) const {
  for (;;) {
    const uint32_t seen = bell.load(std::memory_order_seq_cst);  // before the check: no lost wake-up
    if (ready()) return absl::OkStatus();
    if (absl::Status gone = heed_members ? GoneOrNoticed() : absl::OkStatus(); !gone.ok()) return gone;
    if (absl::Status stop = interrupted(); !stop.ok()) return stop;
    if (!SleepOnBell(bell, seen, deadline)) return late();
  }
}

absl::Status StageSteps::WaitAll(Counter counter, uint64_t at, absl::Time deadline, const char* what,
                                 const Interrupted& interrupted) const {
  std::vector<uint32_t> missing;
  const auto ready = [&] {
    missing.clear();
    for (uint32_t i = 0; i < members(); ++i) {
      if ((header().member[i].*counter).load(std::memory_order_acquire) < at) missing.push_back(rank_of(i));
    }
    return missing.empty();
  };
  return WaitUntil(header().bell, ready, deadline, interrupted, [&] {
    return absl::DeadlineExceededError(
        absl::StrCat("host stage: ranks ", absl::StrJoin(missing, ","), " of this host did not ", what, " in time"));
  });
}

absl::Status StageSteps::WaitResult(uint64_t step, bool own_leg, absl::Time deadline,
                                    const Interrupted& interrupted) const {
  const StageResult& r = result(step);
  // This worker's own network leg: its end is waited for even with a member gone. Until then the
  // engine may write into the bank, and the key has an op in flight that no next one may overlap.
  const auto posted = [&] { return r.step.load(std::memory_order_acquire) >= step; };
  const auto late = [&] {
    return absl::DeadlineExceededError(
        first() ? std::string("host stage: this worker's network leg of the host's sum did not end by its deadline")
                : absl::StrCat("host stage: no result from rank ", rank_of(0), ", which pushes this host's sum, in time"));
  };
  absl::Status waited = WaitUntil(header().result_bell, posted, deadline, interrupted, late, /*heed_members=*/!own_leg);
  if (!waited.ok()) return waited;
  // The bank's next step waits for this member to read this one's, unless a deadline let it past.
  if (r.step.load(std::memory_order_acquire) != step) {
    return absl::AbortedError(
        "host stage: a later step's result took this one's place (a member ran past its deadline)");
  }
  return ReadStatus(r.status);
}

absl::Status StageSteps::Agree(const StepSpec& s, uint64_t step) const {
  if (absl::Status mine_intact = OwnRecordIntact(s, step); !mine_intact.ok()) return mine_intact;
  for (uint32_t i = 0; i < members(); ++i) {
    const StageMember& m = header().member[i];
    if (m.step != step) {
      if (absl::Status noticed = Noticed(step); !noticed.ok()) return noticed;
      // A member that gives a step up before its part is in marks it so (GiveUp): without the
      // mark, something other than the member wrote its record.
      if (m.abandoned[step % kStageBanks].load(std::memory_order_acquire) < step) {
        return absl::DataLossError(absl::StrCat("host stage: the shared region says rank ", rank_of(i),
                                                " came to step ", m.step, " of this host's stage where it came to step ",
                                                step, ": the region was written by a process other than its worker"));
      }
      return absl::AbortedError(
          absl::StrCat("host stage: rank ", rank_of(i), " gave up on this op (it failed before its part was in)"));
    }
    if (RecordOf(m) != RecordOf(s, step)) {
      return absl::InvalidArgumentError(
          absl::StrCat("host stage: rank ", rank_of(i), " runs ", Describe(RecordOf(m)), " where rank ",
                       rank_of(m_.welcome.member), " runs ", Describe(RecordOf(s, step)),
                       ": every worker must run the same ops in the same order"));
    }
  }
  return absl::OkStatus();
}

absl::Status StageSteps::OwnRecordIntact(const StepSpec& s, uint64_t step) const {
  const OpRecord seen = RecordOf(mine());
  if (seen == RecordOf(s, step)) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      "host stage: the shared region's record of rank ", rank_of(m_.welcome.member), "'s op says ", Describe(seen),
      " at step ", seen.step, " where this worker wrote ", Describe(RecordOf(s, step)), " at step ", step,
      ": the region was written by a process other than its worker"));
}

void StageSteps::Share(const StepSpec& s, uint64_t step) {
  const auto [begin, end] = ShareOf(m_.welcome.member, members(), s.elems);
  if (begin >= end || s.result_only) return;
  float* sum = bank(step) + begin;
  const size_t n = end - begin;
  if (s.kind != 0) {  // a broadcast: the root's values, exactly (a sum would turn -0 into +0)
    const auto root = std::find(ranks().begin(), ranks().end(), s.kind - 1);
    if (root == ranks().end()) return (void)std::memset(sum, 0, n * sizeof(float));
    return (void)std::memcpy(sum, slot(static_cast<uint32_t>(root - ranks().begin())) + begin, n * sizeof(float));
  }
  reduce::SumOf(sum, slot(0) + begin, slot(1) + begin, n);  // a stage has two members at least
  for (uint32_t i = 2; i < members(); ++i) reduce::SumInto(sum, slot(i) + begin, n);
}

void StageSteps::PostLoss(uint64_t step, const StageLoss& loss, const std::vector<uint8_t>& classes) {
  StageResult& r = result(step);
  r.loss = loss;
  r.class_count = static_cast<uint32_t>(std::min<size_t>(classes.size(), kStageMaxClasses));
  if (r.class_count > 0) std::memcpy(r.classes, classes.data(), r.class_count);
}

StageLoss StageSteps::loss(uint64_t step) const { return result(step).loss; }

std::vector<uint8_t> StageSteps::classes(uint64_t step) const {
  const StageResult& r = result(step);
  return std::vector<uint8_t>(r.classes, r.classes + std::min(r.class_count, kStageMaxClasses));
}

void StageSteps::PostResult(uint64_t step, const absl::Status& status) {
  StageResult& r = result(step);
  if (r.step.load(std::memory_order_relaxed) >= step) return;
  WriteStatus(status, &r.status);
  r.step.store(step, std::memory_order_release);
  RingBell(header().result_bell);
}

absl::Status StageSteps::AwaitLegOf(uint32_t key, uint64_t step, absl::Time deadline,
                                    const Interrupted& interrupted) {
  // A leg kStageBanks steps back or more has ended: its bank was used again.
  std::erase_if(legs_, [&](const auto& leg) { return leg.second + kStageBanks <= step; });
  const auto last = legs_.find(key);
  if (last == legs_.end()) return absl::OkStatus();
  const uint64_t at = last->second;
  return WaitUntil(header().result_bell, [&] { return result(at).step.load(std::memory_order_acquire) >= at; },
                   deadline, interrupted, [&] {
    return absl::DeadlineExceededError(
        absl::StrCat("host stage: the network leg of key ", key, " did not end by its deadline"));
  });
}

bool StageSteps::Lead(uint64_t step, const StepSpec& spec, const NetworkLeg& leg, absl::Time deadline,
                      const Interrupted& interrupted) {
  absl::Status status = WaitAll(&StageMember::summed, step, deadline, "sum their shares", interrupted);
  for (uint32_t i = 0; status.ok() && i < members(); ++i) {
    // Later than `step`: that member is a bank's round of steps on, which only a deadline can have
    // let it be; its share of this one is not to be trusted either.
    if (header().member[i].abandoned[step % kStageBanks].load(std::memory_order_acquire) >= step) {
      status = Noticed(step);
      if (!status.ok()) break;
      status = absl::AbortedError(absl::StrCat("host stage: rank ", rank_of(i), " gave up on key ", spec.key,
                                               " (its op failed before its part was in)"));
    }
  }
  if (status.ok() && leg) status = AwaitLegOf(spec.key, step, deadline, interrupted);
  if (!status.ok() || !leg) {
    PostResult(step, status);
    return false;
  }
  legs_[spec.key] = step;
  leg(bank(step), spec, step, [this, step](const absl::Status& s) { PostResult(step, s); });
  return true;
}

void StageSteps::WriteSpec(uint64_t step, const StepSpec& spec) {
  StageMember& me = mine();
  me.step = step;
  me.key = spec.key;
  me.kind = KindOf(spec);
  me.loss_bound_ppm = spec.loss_bound_ppm;
  me.offset = spec.offset;
  me.elems = spec.elems;
  me.tensor_elems = spec.tensor_elems;
}

BegunStep StageSteps::Begin(const StepSpec& spec, const StepIo& io, const NetworkLeg& leg, absl::Time deadline,
                            const Interrupted& interrupted) {
  const uint64_t step = ++step_;
  // This member's slot is free once every member has summed the step before.
  absl::Status status = WaitAll(&StageMember::summed, step - 1, deadline, "finish their last op", interrupted);
  if (status.ok()) status = AwaitBank(step, deadline, interrupted);
  if (status.ok()) {
    WriteSpec(step, spec);
    mine().came_ns[step % kStageBanks] = MonotonicNanos();
    if (io.in) status = io.in(slot(m_.welcome.member));
  }
  // Marked given up before it counts as arrived: a member that finds this one's record at another
  // step then knows why (Agree).
  if (!status.ok()) GiveUp(step, status);
  Publish(&StageMember::arrived, step);
  if (status.ok()) status = WaitAll(&StageMember::arrived, step, deadline, "start the same op", interrupted);
  const absl::Time gathered = MonotonicNow();
  if (status.ok()) status = Agree(spec, step);
  if (status.ok()) Share(spec, step);
  if (!status.ok()) GiveUp(step, status);
  Publish(&StageMember::summed, step);
  bool led = false;
  if (first()) {
    if (status.ok()) {
      led = Lead(step, spec, leg, deadline, interrupted);
    } else {
      PostResult(step, status);
    }
  }
  return BegunStep{step, status, gathered, led};
}

absl::Status StageSteps::AwaitBank(uint64_t step, absl::Time deadline, const Interrupted& interrupted) const {
  // The bank is free once every member has read the result of the step that used it last.
  if (step <= kStageBanks) return absl::OkStatus();
  return WaitAll(&StageMember::consumed, step - kStageBanks, deadline, "finish an op before the last ones",
                 interrupted);
}

std::vector<absl::Time> StageSteps::Came(const BegunStep& begun) const {
  std::vector<absl::Time> came;
  for (uint32_t i = 0; i < members(); ++i) {
    came.push_back(absl::FromUnixNanos(header().member[i].came_ns[begun.step % kStageBanks]));
  }
  return came;
}

absl::Status StageSteps::End(const BegunStep& begun, const std::function<absl::Status(const float*)>& out,
                             absl::Time deadline, const Interrupted& interrupted) {
  // Even a step given up waits for its result, which the first member posts only once it looked at
  // every member's part: so no member gives up the bank's next step before that look.
  // The first member's network leg ends by the same deadline; its answer may come just after.
  const absl::Status result = WaitResult(begun.step, begun.led, deadline + kResultGrace, interrupted);
  absl::Status status = begun.status.ok() ? result : begun.status;
  if (status.ok()) status = out(bank(begun.step));
  if (!status.ok()) Notify(begun.step, status);  // the others name this cause should this worker leave over it
  Publish(&StageMember::consumed, begun.step);
  return status;
}

BegunStep StageSteps::GiveUpStep(const StepSpec& spec, const absl::Status& why, absl::Time deadline,
                                 const Interrupted& interrupted) {
  const uint64_t step = ++step_;
  // Marking the bank's step given up must wait, as Begin does, for the bank's last step to end.
  AwaitBank(step, deadline, interrupted).IgnoreError();  // it fails as `why` in any case
  WriteSpec(step, spec);
  GiveUp(step, why);
  Publish(&StageMember::arrived, step);
  Publish(&StageMember::summed, step);
  if (first()) PostResult(step, why);
  return BegunStep{step, why};
}

StepIo HostStepIo(const float* in, float* out, uint64_t elems) {
  StepIo io;
  if (in != nullptr) {
    io.in = [in, elems](float* slot) {
      std::memcpy(slot, in, elems * sizeof(float));
      return absl::OkStatus();
    };
  }
  io.out = [out, elems](const float* result) {
    std::memcpy(out, result, elems * sizeof(float));
    return absl::OkStatus();
  };
  return io;
}

}  // namespace dlcp
