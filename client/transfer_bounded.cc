// The bounded-loss half of TransferEngine: classes and error feedback before a round, the
// manifest, STOP, and the bounded pull mode's tail. See docs/bounded-loss.md.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "client/transfer_engine.h"
#include "common/base/log.h"
#include "common/datapath/quiet_spell.h"
#include "common/wire/bounded.h"
#include "common/wire/ranges.h"

namespace dlcp {

void TransferEngine::ApplyResidual(Op& op) {
  auto it = residuals_.find(op.key);
  if (it == residuals_.end() || it->second.values.size() != op.geometry.tensor_elems) return;
  for (uint32_t c : it->second.chunks) {
    float* keep = it->second.values.data() + op.geometry.offset(c);
    float* data = op.data + op.geometry.offset(c);
    for (uint32_t i = 0; i < op.geometry.elems(c); ++i) {
      data[i] += keep[i];
      keep[i] = 0;
    }
    // A device op's packets are already written: the chunk's payload changes with its data.
    if (op.device) {
      wire::EncodeValues(data, op.geometry.elems(c), op.encoding, op.packets.data() + c * op.packet_stride + wire::kHeaderSize);
    }
  }
  it->second.chunks.clear();
}

PackInput TransferEngine::PackInputOf(const Op& op, const void* data) const {
  PackInput in;
  in.data = data;
  // The epoch differs per aggregator; PushSome writes each header for its destination anyway.
  in.tensors = {PackTensor{0, op.geometry.tensor_elems, op.key, op.round, op.tensor.layer, 0,
                                static_cast<double>(op.loss_bound_ppm) / wire::kPpm}};
  in.chunk_elems = op.geometry.chunk_elems;
  in.job = options_.job;
  in.rank = options_.rank;
  in.num_layers = op.tensor.num_layers;
  in.encoding = op.encoding;
  return in;
}

absl::Status TransferEngine::PackDevice(Op& op) {
  std::unique_ptr<Packer>& packer = device_packers_[op.device->device];
  if (packer == nullptr) {
    absl::StatusOr<std::unique_ptr<Packer>> created =
        CreatePacker({PackerOptions::Device::kCuda, op.device->device, options_.class_policy});
    if (!created.ok()) return created.status();
    packer = std::move(*created);
  }
  PackInput in = PackInputOf(op, op.device->data);
  in.type = op.device->type;
  absl::StatusOr<PackLayout> layout = PlanPack(in, options_.class_policy);
  if (!layout.ok()) return layout.status();
  op.packets.resize(layout->packet_bytes());
  op.packet_stride = layout->stride;
  PackOutput out;
  out.packets = op.packets.data();
  if (absl::Status s = packer->Pack(in, &out); !s.ok()) return s;
  op.chunks.classes = std::move(out.classes);
  // What goes on the wire, as float32: error feedback and a regroup's restart work on it as on a
  // host tensor's data, and the results land on it.
  for (uint32_t c = 0; c < op.geometry.chunk_count(); ++c) {
    wire::DecodeValues(op.packets.data() + c * op.packet_stride + wire::kHeaderSize, op.geometry.elems(c), op.encoding,
                       op.data + op.geometry.offset(c));
  }
  ApplyResidual(op);
  return absl::OkStatus();
}

absl::Status TransferEngine::Prepare(Op& op) {
  const uint32_t chunks = op.geometry.chunk_count();
  if (op.device) {
    if (absl::Status s = PackDevice(op); !s.ok()) return s;
  } else {
    // Even a reliable round carries what earlier bounded rounds left out; a broadcast carries only
    // the root's data.
    if (op.broadcast_root >= 0) {
      if (op.broadcast_root != options_.rank) std::fill(op.data, op.data + op.geometry.tensor_elems, 0.0f);
    } else {
      ApplyResidual(op);
    }
    if (options_.phase_aware.enabled && op.loss_bound_ppm > 0 && op.broadcast_root < 0) {
      double sum = 0;
      for (uint32_t i = 0; i < op.geometry.tensor_elems; ++i) sum += static_cast<double>(op.data[i]) * op.data[i];
      const double bound = phase_.Next(op.key, static_cast<double>(op.loss_bound_ppm) / wire::kPpm, std::sqrt(sum));
      op.loss_bound_ppm = static_cast<uint32_t>(std::lround(bound * wire::kPpm));
      op.stats.loss_bound = bound;
    }
    if (absl::Status s = PackHost(op); !s.ok()) return s;
  }
  for (uint8_t c : op.chunks.classes) ++op.stats.chunks_by_class[c];
  if (op.report_classes) op.stats.classes = op.chunks.classes;
  op.bounded.class0_pending = static_cast<uint32_t>(op.stats.chunks_by_class[0]);
  op.bounded.droppable_chunks = chunks - op.bounded.class0_pending;
  op.bounded.droppable_pending = op.bounded.droppable_chunks;
  return absl::OkStatus();
}

absl::Status TransferEngine::PackHost(Op& op) {
  // One pass classes every chunk and, for a 16-bit encoding, writes its payload.
  PackInput in = PackInputOf(op, op.data);
  in.write_packets = op.encoding != wire::Encoding::kF32;
  absl::StatusOr<PackLayout> layout = PlanPack(in, options_.class_policy);
  if (!layout.ok()) return layout.status();
  // One class for the whole tensor (a reliable round's, by default) and float32 sent straight
  // from it: the packer would only read every value for magnitudes nobody uses, a pass over the
  // tensor that delays the round's first push (about 3 ms of CPU for 20 MiB).
  if (const uint8_t uniform = layout->tiers[0].uniform; uniform != kNoUniform && !in.write_packets) {
    op.chunks.classes.assign(op.geometry.chunk_count(), uniform);
    return absl::OkStatus();
  }
  PackOutput out;
  if (in.write_packets) {
    op.packets.resize(layout->packet_bytes());
    op.packet_stride = layout->stride;
    out.packets = op.packets.data();
  }
  if (absl::Status s = packer_->Pack(in, &out); !s.ok()) return s;
  op.chunks.classes = std::move(out.classes);
  return absl::OkStatus();
}

namespace {
// A full window counts as stalled after 4 mean result gaps of silence, at least 1 ms.
constexpr double kStallGaps = 4;
constexpr absl::Duration kMinStall = absl::Milliseconds(1);
}  // namespace

absl::Time TransferEngine::PullTailEnd(const Op& op) const {
  return QuietSpellEnd(op.clock.start, op.clock.last_progress, op.geometry.chunk_count() - op.remaining, kTailGaps, kMinTail,
                       options_.repair_timeout);
}

void TransferEngine::ReleaseStalledWindows(Op& op, absl::Time now) {
  if (now < QuietSpellEnd(op.clock.start, op.clock.last_progress, op.geometry.chunk_count() - op.remaining, kStallGaps, kMinStall,
                          options_.repair_timeout)) {
    return;
  }
  for (uint32_t d = 0; d < op.dests.size(); ++d) {
    Dest& dest = op.dests[d];
    if ((dest.next < op.plan->chunks_by_dest[d].size() || !dest.resend.empty()) &&
        dest.next - dest.acked + dest.repairs_out >= WindowOf(d)) {
      dest.acked = dest.next;
      dest.repairs_out = 0;
    }
  }
}

void TransferEngine::MaybeComplete(Op& op, absl::Time now) {
  if (op.bounded.stops_pending > 0) return;
  if (op.remaining == 0) return Complete(op, now);
  if (op.bounded.pull_ppm == 0 || op.bounded.pull_armed) return;
  const uint64_t allowed = static_cast<uint64_t>(op.bounded.pull_ppm) * op.bounded.droppable_chunks / wire::kPpm;
  if (op.bounded.class0_pending > 0 || op.bounded.droppable_pending > allowed) return;
  op.bounded.pull_armed = true;
  next_tail_ = std::min(next_tail_, PullTailEnd(op));
}

void TransferEngine::CompletePartial(Op& op, absl::Time now) {
  for (uint32_t c = 0; c < op.geometry.chunk_count(); ++c) {
    if (op.chunks.state[c] == kHave) continue;
    std::fill_n(op.data + op.geometry.offset(c), op.geometry.elems(c), 0.0f);
    ++op.stats.pull_missing;
  }
  Complete(op, now);
}

std::vector<uint8_t> TransferEngine::WantedResults(const Op& op) const {
  if (op.bounded.pull_ppm == 0 || op.bounded.stops_pending > 0) return {};
  const uint64_t allowed = static_cast<uint64_t>(op.bounded.pull_ppm) * op.bounded.droppable_chunks / wire::kPpm;
  std::vector<uint8_t> wanted(op.geometry.chunk_count(), 0);
  std::vector<uint32_t> droppable;
  for (uint32_t c = 0; c < op.geometry.chunk_count(); ++c) {
    if (op.chunks.state[c] == kHave) continue;
    if (op.chunks.classes[c] == 0) {
      wanted[c] = 1;
    } else {
      droppable.push_back(c);
    }
  }
  const size_t need = op.bounded.droppable_pending > allowed ? op.bounded.droppable_pending - allowed : 0;
  std::stable_sort(droppable.begin(), droppable.end(),
                   [&](uint32_t a, uint32_t b) { return op.chunks.classes[a] < op.chunks.classes[b]; });
  for (size_t i = 0; i < need && i < droppable.size(); ++i) wanted[droppable[i]] = 1;
  return wanted;
}

void TransferEngine::SendManifest(const Op& op, uint32_t dest) {
  std::vector<uint8_t> classes(op.geometry.chunk_count(), wire::kNotHere);
  for (uint32_t c : op.plan->chunks_by_dest[dest]) classes[c] = op.chunks.classes[c];
  const size_t max_payload = wire::ControlPayloadLimit(transport_->max_datagram(), options_.chunk_bytes);
  wire::Header h = BaseHeader(wire::MsgType::kManifest, dest, op.key, op.round, op.geometry.tensor_elems,
                              op.geometry.chunk_count());
  h.contributors = op.carries > 1 ? op.carries : 0;  // a host stage's sum: it declares for the stage
  for (std::vector<uint8_t>& p : wire::EncodeManifest(op.loss_bound_ppm, classes, max_payload)) {
    if (injector_.Drop(0)) continue;
    h.payload_len = static_cast<uint32_t>(p.size());
    absl::Status s = outbox_.AddOwned(flows_[dest].addr, h, std::move(p), flows_[dest].sign_key);
    if (!s.ok()) DLCP_LOG(Warning) << "manifest: " << s;
  }
}

void TransferEngine::HandleStop(Op& op, const wire::Header& h, const uint8_t* payload, uint32_t from_dest,
                                absl::Time now) {
  absl::StatusOr<wire::StopInfo> stop =
      wire::DecodeStop(absl::MakeConstSpan(payload, h.payload_len), op.geometry.chunk_count());
  if (!stop.ok()) return Reject(wire::Reject::kBadPayload);
  if (op.bounded.stopped[from_dest]) return;  // another part, or a repeat
  op.bounded.stopped[from_dest] = true;
  if (--op.bounded.stops_pending == 0) TraceMoment(op, "stop", now);
  op.stats.tail_wait = std::max(op.stats.tail_wait, wire::DecodeTailWait(h.chunk));
  op.stats.droppable_total += stop->droppable_total;
  op.stats.droppable_missing += stop->droppable_missing;
  const uint64_t allowed = static_cast<uint64_t>(op.loss_bound_ppm) * stop->droppable_total / wire::kPpm;
  if (stop->droppable_missing > allowed) {
    ++op.stats.bound_violations;
    DLCP_LOG(Error) << "aggregator " << flows_[from_dest].addr.ToString() << " sealed key " << op.key << " round "
                    << op.round << " with " << stop->droppable_missing << " of " << stop->droppable_total
                    << " droppable contributions missing, over the bound of " << allowed;
  }
  op.stats.time_to_stop = now - op.clock.start;
  op.clock.last_progress = now;
  MaybeComplete(op, now);
}

}  // namespace dlcp
