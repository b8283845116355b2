#include "client/host/stage_steps.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/clock.h"
#include "common/shm/futex_bell.h"
#include "common/wire/bounded.h"
#include "server/engine/reduce.h"

namespace dlcp {
namespace {

constexpr absl::Duration kResultGrace = absl::Seconds(5);

std::string Describe(const StageMember& m) {
  const std::string what = m.kind == 0 ? "an all-reduce" : absl::StrCat("a broadcast from rank ", m.kind - 1);
  const std::string bound =
      m.loss_bound_ppm == 0 ? "" : absl::StrCat(", loss bound ", static_cast<double>(m.loss_bound_ppm) / wire::kPpm);
  return absl::StrCat(what, " of key ", m.key, " (", m.tensor_elems, " elements", bound, ")");
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
  if (c.load(std::memory_order_relaxed) < step) c.store(step, std::memory_order_release);
  RingBell(header().bell);
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
  StageNotice& n = header().notice;
  uint64_t claimed = n.claimed.load(std::memory_order_acquire);
  while (claimed < step && !n.claimed.compare_exchange_weak(claimed, step, std::memory_order_acq_rel)) {
  }
  if (claimed >= step) return;  // another member said it first (or a later step is under way)
  WriteStatus(why, &n.status);
  n.step.store(step, std::memory_order_release);
  RingBell(header().bell);
}

absl::Status StageSteps::Noticed(uint64_t step) const {
  const StageNotice& n = header().notice;
  if (n.step.load(std::memory_order_acquire) != step) return absl::OkStatus();
  return ReadStatus(n.status);
}

absl::Status StageSteps::GoneOrNoticed() const {
  absl::Status gone = Gone();
  if (gone.ok()) return gone;
  absl::Status noticed = Noticed(step_);
  return noticed.ok() ? gone : noticed;
}

absl::Status StageSteps::WaitUntil(const std::function<bool()>& ready, absl::Time deadline,
                                   const std::function<absl::Status()>& interrupted,
                                   const std::function<absl::Status()>& late) const {
  for (;;) {
    const uint32_t seen = header().bell.load(std::memory_order_seq_cst);  // before the check: no lost wake-up
    if (ready()) return absl::OkStatus();
    if (absl::Status gone = GoneOrNoticed(); !gone.ok()) return gone;
    if (absl::Status stop = interrupted(); !stop.ok()) return stop;
    if (!SleepOnBell(header().bell, seen, deadline)) return late();
  }
}

absl::Status StageSteps::WaitAll(Counter counter, uint64_t step, absl::Time deadline, const char* what,
                                 const std::function<absl::Status()>& interrupted) const {
  std::vector<uint32_t> missing;
  const auto ready = [&] {
    missing.clear();
    for (uint32_t i = 0; i < members(); ++i) {
      if ((header().member[i].*counter).load(std::memory_order_acquire) < step) missing.push_back(rank_of(i));
    }
    return missing.empty();
  };
  return WaitUntil(ready, deadline, interrupted, [&] {
    return absl::DeadlineExceededError(
        absl::StrCat("host stage: ranks ", absl::StrJoin(missing, ","), " of this host did not ", what, " in time"));
  });
}

absl::Status StageSteps::WaitResult(uint64_t step, absl::Time deadline,
                                    const std::function<absl::Status()>& interrupted) const {
  const StageResult& r = header().result;
  absl::Status waited = WaitUntil([&] { return r.step.load(std::memory_order_acquire) >= step; }, deadline,
                                  interrupted, [&] {
                                    return absl::DeadlineExceededError(absl::StrCat(
                                        "host stage: no result from rank ", rank_of(0),
                                        ", which pushes this host's sum, in time"));
                                  });
  return waited.ok() ? ReadStatus(r.status) : waited;
}

absl::Status StageSteps::Agree(const StepSpec& s, uint64_t step) const {
  for (uint32_t i = 0; i < members(); ++i) {
    const StageMember& m = header().member[i];
    if (m.step != step) {
      if (absl::Status noticed = Noticed(step); !noticed.ok()) return noticed;
      return absl::AbortedError(
          absl::StrCat("host stage: rank ", rank_of(i), " gave up on this op (it failed before its part was in)"));
    }
    if (m.key != s.key || m.kind != s.kind || m.offset != s.offset || m.elems != s.elems ||
        m.tensor_elems != s.tensor_elems || m.loss_bound_ppm != s.loss_bound_ppm) {
      return absl::InvalidArgumentError(
          absl::StrCat("host stage: rank ", rank_of(i), " runs ", Describe(m), " where rank ",
                       rank_of(m_.welcome.member), " runs ", Describe(mine()),
                       ": every worker must run the same ops in the same order"));
    }
  }
  return absl::OkStatus();
}

void StageSteps::Share(const StepSpec& s) {
  const auto [begin, end] = ShareOf(m_.welcome.member, members(), s.elems);
  if (begin >= end) return;
  float* sum = slot(0) + begin;
  if (s.kind != 0) {  // a broadcast: the root's values, exactly (a sum would turn -0 into +0)
    const auto root = std::find(ranks().begin(), ranks().end(), s.kind - 1);
    if (root == ranks().end()) return (void)std::memset(sum, 0, (end - begin) * sizeof(float));
    const auto member = static_cast<uint32_t>(root - ranks().begin());
    if (member != 0) std::memcpy(sum, slot(member) + begin, (end - begin) * sizeof(float));
    return;
  }
  for (uint32_t i = 1; i < members(); ++i) engine::SumInto(sum, slot(i) + begin, end - begin);
}

void StageSteps::PostLoss(const StageLoss& loss, const std::vector<uint8_t>& classes) {
  StageResult& r = header().result;
  r.loss = loss;
  r.class_count = static_cast<uint32_t>(std::min<size_t>(classes.size(), kStageMaxClasses));
  if (r.class_count > 0) std::memcpy(r.classes, classes.data(), r.class_count);
}

StageLoss StageSteps::loss() const { return header().result.loss; }

std::vector<uint8_t> StageSteps::classes() const {
  const StageResult& r = header().result;
  return std::vector<uint8_t>(r.classes, r.classes + std::min(r.class_count, kStageMaxClasses));
}

void StageSteps::PostResult(uint64_t step, const absl::Status& status) {
  StageResult& r = header().result;
  if (r.step.load(std::memory_order_relaxed) >= step) return;
  WriteStatus(status, &r.status);
  r.step.store(step, std::memory_order_release);
  RingBell(header().bell);
}

absl::Status StageSteps::Lead(uint64_t step, const StepSpec& spec, const NetworkLeg& leg, absl::Time deadline,
                              const std::function<absl::Status()>& interrupted) {
  absl::Status status = WaitAll(&StageMember::summed, step, deadline, "sum their shares", interrupted);
  for (uint32_t i = 0; status.ok() && i < members(); ++i) {
    if (header().member[i].abandoned.load(std::memory_order_acquire) == step) {
      status = Noticed(step);
      if (!status.ok()) break;
      status = absl::AbortedError(absl::StrCat("host stage: rank ", rank_of(i), " gave up on key ", spec.key,
                                               " (its op failed before its part was in)"));
    }
  }
  if (status.ok() && leg) status = leg(slot(0), spec);
  PostResult(step, status);
  return status;
}

absl::Status StageSteps::Finish(uint64_t step, const absl::Status& status) {
  if (!status.ok()) {
    Notify(step, status);
    mine().abandoned.store(step, std::memory_order_release);
  }
  Publish(&StageMember::arrived, step);
  Publish(&StageMember::summed, step);
  if (first()) PostResult(step, status);
  Publish(&StageMember::consumed, step);
  return status;
}

void StageSteps::WriteSpec(uint64_t step, const StepSpec& spec) {
  StageMember& me = mine();
  me.step = step;
  me.key = spec.key;
  me.kind = spec.kind;
  me.loss_bound_ppm = spec.loss_bound_ppm;
  me.offset = spec.offset;
  me.elems = spec.elems;
  me.tensor_elems = spec.tensor_elems;
}

absl::Status StageSteps::Skip(const StepSpec& spec, const absl::Status& why) {
  const uint64_t step = ++step_;
  WriteSpec(step, spec);
  return Finish(step, why);
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

absl::Status StageSteps::Run(const StepSpec& spec, const StepIo& io, const NetworkLeg& leg, absl::Time deadline,
                             const std::function<absl::Status()>& interrupted) {
  const uint64_t step = ++step_;
  // Slot 0 and this member's slot are free once every member has read the last step's result.
  absl::Status status = WaitAll(&StageMember::consumed, step - 1, deadline, "finish their last op", interrupted);
  if (!status.ok()) return Finish(step, status);
  WriteSpec(step, spec);
  if (io.in) status = io.in(slot(m_.welcome.member));
  Publish(&StageMember::arrived, step);
  if (status.ok()) status = WaitAll(&StageMember::arrived, step, deadline, "start the same op", interrupted);
  if (status.ok()) status = Agree(spec, step);
  if (status.ok()) Share(spec);
  if (!status.ok()) {
    Notify(step, status);
    mine().abandoned.store(step, std::memory_order_release);
  }
  Publish(&StageMember::summed, step);
  if (first() && status.ok()) {
    status = Lead(step, spec, leg, deadline, interrupted);
  } else if (first()) {
    PostResult(step, status);
  } else {
    // The first member's network leg ends by the same deadline; its answer may come just after.
    const absl::Status result = WaitResult(step, deadline + kResultGrace, interrupted);
    if (status.ok()) status = result;
  }
  if (status.ok()) status = io.out(slot(0));
  return Finish(step, status);
}

}  // namespace dlcp
