// The shared memory of a host stage (docs/host-stage.md): the workers of one job on one host sum
// their tensors here before one of them pushes the host's sum to the aggregators. dlcpd creates
// the region and hands it to each member over its host socket (host_hello.h); the members then
// coordinate through this header alone.
//
// Layout: StageHeader at offset 0, then `members` + kStageBanks slots of slot_bytes each, starting
// at kStageSlotsOffset. Slot i < members is member i's input; the last kStageBanks slots are the
// sum slots, which take a step's sum and then its result. Step s sums into bank s % kStageBanks,
// so the members copy and sum the next steps while the first member's network legs still run on
// the sums of up to kStageBanks - 1 steps before (StageSteps::Begin, End): as many ops in flight
// as a trainer's pipelined optimizer keeps on the network path, within bounded shared memory.
//
// Every field a member writes is its own (StageMember[i]) or, for the results, the first member's;
// dlcpd writes only `gone`. A member checks what it reads against what the broker told it (the
// geometry is the Welcome's, never the header's), so a corrupt header fails an op, not a process.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace dlcp {

inline constexpr uint32_t kStageMagic = 0x47545344;  // "DSTG"
inline constexpr uint32_t kStageVersion = 6;
inline constexpr uint32_t kStageBanks = 8;
inline constexpr uint32_t kMaxStageMembers = 64;
inline constexpr uint32_t kStageMessageBytes = 480;

// What each member says about the step it is on. A step is one slot's worth of one op.
struct alignas(64) StageMember {
  std::atomic<uint64_t> arrived;    // the step whose input (and `step`) it has written
  std::atomic<uint64_t> summed;     // the step whose share of the sum it has added
  std::atomic<uint64_t> consumed;   // the step whose result it has read (its bank is free again)
  // Per bank, the latest step of it that this member gave up (its op failed): no sum for it.
  std::atomic<uint64_t> abandoned[kStageBanks];
  // The op of step `arrived`, which every member must agree on, and that step (a member that gave
  // the step up before it came leaves an older one here).
  uint64_t step;
  uint32_t key;
  uint32_t kind;  // 0: all-reduce; 1 + root: broadcast from rank `root`
  uint64_t offset;  // elements of the tensor before this step's part
  uint64_t elems;   // elements in this step's part
  uint64_t tensor_elems;
  uint32_t loss_bound_ppm;  // the op's ε, in millionths
  // Per bank: when this member came to its latest step of it, ready to write its part
  // (CLOCK_MONOTONIC nanoseconds, one clock for every process of the host): how late it is.
  int64_t came_ns[kStageBanks];
};
static_assert(sizeof(StageMember) == 256);

// An absl::Status as one member leaves it for the others (StageSteps::WriteStatus, ReadStatus).
struct StageStatus {
  int32_t code;  // absl::StatusCode; 0: OK
  uint32_t message_len;
  char message[kStageMessageBytes];
};

// What the first member's network leg of a bounded-loss step said of the round's losses, which
// the other members report as theirs (the stage's contributions are theirs too).
struct StageLoss {
  uint64_t chunks_by_class[4];
  uint64_t left_out_by_class[4];
  uint64_t droppable_total;
  uint64_t droppable_missing;
  uint64_t pull_missing;
  uint32_t bound_violations;
  uint32_t min_contributors;
  uint32_t loss_bound_ppm;  // the ε the round ran under (phase_aware may raise the op's)
};
static_assert(sizeof(StageLoss) == 104);

// The most chunks a bounded-loss step through a stage may have: their classes travel in the
// header.
inline constexpr uint32_t kStageMaxClasses = 4096;

struct StageResult {
  std::atomic<uint64_t> step;  // the step whose result its bank now holds (or whose error this is)
  StageStatus status;          // OK: the bank holds the result
  StageLoss loss;              // written before `step`, as are the two below
  uint32_t class_count;        // the bounded step's chunks, whose classes follow
  uint8_t classes[kStageMaxClasses];
};
static_assert(sizeof(StageResult) == 4704);

// Why a step was given up, from the first member that gave it up: a worker whose op failed (its
// job failed, say) may leave at once, and the others then name that cause, not its leaving. A
// member claims the notice for a step, writes it, then publishes the step.
struct StageNotice {
  std::atomic<uint64_t> claimed;
  std::atomic<uint64_t> step;
  StageStatus status;
};

struct alignas(64) StageHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t members;
  uint32_t reserved;
  uint64_t slot_bytes;
  // Bumped (and woken) by every publication of a member's counters, a notice or `gone`: what the
  // waits for the members' progress sleep on.
  alignas(64) std::atomic<uint32_t> bell;
  // Bumped (and woken) by every result posted, a notice or `gone`: what the waits for results
  // sleep on. Apart from `bell`, so a worker's thread that ends steps is not woken by every
  // member's progress, nor its thread that begins them by every result.
  alignas(64) std::atomic<uint32_t> result_bell;
  // dlcpd: member i's process is gone (its host socket closed); 0: alive.
  std::atomic<uint32_t> gone[kMaxStageMembers];
  // Per bank: the result of its latest step, and why that step was given up.
  alignas(64) StageResult result[kStageBanks];
  alignas(64) StageNotice notice[kStageBanks];
  StageMember member[kMaxStageMembers];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free);
inline constexpr size_t kStageSlotsOffset = 65536;
static_assert(sizeof(StageHeader) <= kStageSlotsOffset);

inline size_t StageRegionBytes(uint32_t members, uint64_t slot_bytes) {
  return kStageSlotsOffset + static_cast<size_t>(members + kStageBanks) * slot_bytes;
}

// The smallest slots dlcpd gives a stage that does not fit with full ones (`slot_bytes`): below a
// MiB, a step's fixed costs (its waits and wake-ups) outweigh what it moves.
inline uint64_t MinStageSlotBytes(uint64_t slot_bytes) { return slot_bytes < (uint64_t{1} << 20) ? slot_bytes : uint64_t{1} << 20; }

}  // namespace dlcp
