// What TransferEngine keeps per op in flight, and per destination of an op. Owned and touched by
// the engine's I/O thread alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/time/time.h"
#include "client/client.h"
#include "client/leg_gate.h"
#include "common/classes/class_policy.h"
#include "common/wire/geometry.h"
#include "common/wire/payload_encoding.h"

namespace dlcp {

// Which endpoint owns each chunk, for one (key, length). Immutable once built.
struct ChunkPlan {
  uint32_t tensor_elems = 0;
  std::vector<std::vector<uint32_t>> chunks_by_dest;
  std::vector<uint16_t> dest_of_chunk;
  std::vector<uint32_t> pos_in_dest;  // index of each chunk in chunks_by_dest[dest_of_chunk]
};

// One destination (aggregator endpoint) of an op: how far its chunks went out and came back.
struct DestProgress {
  size_t next = 0;  // into plan->chunks_by_dest[d]
  // Positions in chunks_by_dest below this have been passed by a result: the aggregator got
  // that far. Pushes beyond it are in flight; the window bounds them. A chunk below it whose
  // result is still missing is stalled on some loss, and does not hold the window: the
  // aggregator's repair or the bounded-loss seal resolves it (otherwise a few lost pushes
  // could hold every window slot while the seal waits for the chunks behind them).
  size_t acked = 0;
  // Positions below this were checked for a missing result after later ones came back (a
  // loss signal for the endpoint's congestion window).
  size_t gap_scan = 0;
  std::vector<uint32_t> resend;
  // Repairs pushed whose result has not come back: they hold the window too, or a long NACK
  // would go out in one burst and be lost again (a repair storm).
  size_t repairs_out = 0;
};

enum ChunkState : uint8_t { kUnsent = 0, kSent = 1, kHave = 2 };

// Per chunk of an op, indexed by chunk.
struct ChunkMarks {
  std::vector<uint8_t> state;    // ChunkState
  std::vector<uint8_t> classes;  // the priority class this worker gave it
  std::vector<uint64_t> stamps;  // its endpoint window's stamp at its first push
  // How often it was pushed again (repairs), each holding a window slot until its result comes.
  // Saturates at 255.
  std::vector<uint8_t> repushes;
  std::vector<uint8_t> paths;      // the send path of its first push (path steering)
  std::vector<uint8_t> resending;  // waiting in its DestProgress::resend
  std::vector<uint8_t> deferred;   // a NACK for its latest push was let pass
};

// A bounded-loss round's own state (docs/bounded-loss.md): STOPs per destination, and the bounded
// pull's count of what is still missing.
struct BoundedRound {
  std::vector<bool> stopped;  // per dest: its STOP arrived
  std::vector<bool> heard;    // per dest: it has answered this round (so it has the manifest or will ask)
  uint32_t stops_pending = 0;
  // Bounded pull: results still missing for chunks this worker classed 0, and for the others.
  uint32_t pull_ppm = 0;
  uint32_t class0_pending = 0, droppable_pending = 0, droppable_chunks = 0;
  bool pull_armed = false;
};

// When an op started, must end, last made progress, and asks for what is missing next.
struct OpClock {
  absl::Time enqueued;  // when Submit took it
  absl::Time start, deadline, last_progress, next_repair;
  absl::Time first_result;  // when the first result arrived (set once one has)
  int repair_attempts = 0;
  uint32_t pushed_once = 0;  // chunks past their first push (or skipped, their result in): the timeline's
};

// What a regroup needs of an op (EngineOptions::retain_inputs).
struct RetainedInput {
  // The data as pushed (after error feedback), and the chunks whose left-out contribution went
  // into the residual, so that a restart can take it back out.
  std::vector<float> input;
  uint64_t kept = 0;  // elements of `input` copied so far (a gated op's grow as it is summed)
  std::vector<uint32_t> left_out;
  // A round this worker had finished, pushed again after a regroup for the workers that had not;
  // its results go to `scratch` and nobody waits for it.
  bool replay = false;
  std::vector<float> scratch;
};

// A host stage's network leg whose sum is still being made (LegGate): each push waits for its
// part. The engine's wake-up leaves with the op, however it leaves.
class GateHold {
 public:
  GateHold() = default;
  GateHold(const GateHold&) = delete;
  GateHold& operator=(const GateHold&) = delete;
  ~GateHold() {
    if (gate_) gate_->Detach();
  }
  void Hold(std::shared_ptr<LegGate> gate, std::function<void()> wake) {
    gate_ = std::move(gate);
    if (gate_) gate_->Attach(std::move(wake));
  }
  const LegGate* get() const { return gate_.get(); }
  // How many elements, from the first, may go out.
  uint64_t ready() const { return gate_ ? gate_->ready() : UINT64_MAX; }
  bool complete() const { return !gate_ || gate_->complete(); }

 private:
  std::shared_ptr<LegGate> gate_;
};

// One all-reduce in flight.
struct TransferOp {
  uint32_t key = 0;
  uint32_t round = 0;
  float* data = nullptr;
  wire::ChunkGeometry geometry;
  std::shared_ptr<const ChunkPlan> plan;
  ChunkMarks chunks;
  // How the values travel. A float32 push sends straight from `data`; other encodings send the
  // payloads of `packets` (the packer's headers there are rebuilt per destination at send time,
  // since each aggregator has its own epoch).
  wire::Encoding encoding = wire::Encoding::kF32;
  std::vector<uint8_t> packets;
  uint64_t packet_stride = 0;
  // A device op: the tensor, and the host buffer `data` points to, which holds what was pushed
  // (decoded from the packets) and then the results.
  std::optional<DeviceTensor> device;
  std::vector<float> staging;
  std::vector<DestProgress> dests;
  uint32_t remaining = 0;
  TensorInfo tensor;
  uint32_t loss_bound_ppm = 0;  // 0: reliable round, no manifest and no STOP
  bool report_classes = false;  // AllReduceOptions::report_classes
  BoundedRound bounded;
  int64_t broadcast_root = -1;
  uint16_t carries = 1;  // ranks whose sum `data` is: a host stage's size, or 1
  GateHold gate;  // unset: `data` is whole from the start
  OpClock clock;
  std::string name;  // on the timeline (AllReduceOptions::name)
  RoundStats stats;
  OpDone done;
  RetainedInput retained;
};

}  // namespace dlcp
