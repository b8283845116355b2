// The endpoint windows' side of TransferEngine: what counts as a chunk acknowledged, and what as
// a loss (common/datapath/congestion_window.h has the rules the window follows).
#include <algorithm>

#include "client/transfer_engine.h"

namespace dlcp {

// Results come back roughly in push order, but not exactly: the aggregator answers a chunk when
// the slowest worker's push of it arrives, and spraying sends bursts over paths (and receive
// queues) of different delay. A chunk still without a result once results came back for chunks
// pushed the window's reorder() stamps after it counts as lost. One whose result comes later
// after all, never pushed again by anyone and not sent again (`lost` false: no
// wire::kFlagRepaired), was only late: that undoes the cut it caused. One that another worker
// had to push again keeps the cut if that push was lost in this worker's class or a more
// important one: every worker's push of a chunk goes through the same switch port into its
// aggregator, so that loss is congestion in a queue this worker's push waited behind. A loss in
// a less important class (wire::Header::lost_class) only says that queue overflowed, which
// strict priority lets happen while the more important ones flow.
void TransferEngine::OnResultPosition(Op& op, uint32_t dest, size_t pos, bool lost) {
  Dest& d = op.dests[dest];
  CongestionWindow& w = flows_[dest].window;
  const std::vector<uint32_t>& mine = op.plan->chunks_by_dest[dest];
  const uint32_t chunk = mine[pos];
  const bool repushed = op.chunks.repushes[chunk] > 0;
  // Every repair of it held a slot; the result frees them all.
  d.repairs_out -= std::min<size_t>(d.repairs_out, op.chunks.repushes[chunk]);
  if (!repushed && !lost && w.OnLate(op.chunks.stamps[chunk])) ++op.stats.window_undos;
  if (Steering()) {
    flows_[dest].paths->OnAcked(op.chunks.paths[chunk]);
    // This worker's push came through on its path, whoever else lost theirs.
    if (!repushed) flows_[dest].paths->OnLate(op.chunks.paths[chunk], op.chunks.stamps[chunk]);
  }
  if (pos + 1 > d.acked) {
    w.OnAcked(static_cast<uint32_t>(pos + 1 - d.acked));
    d.acked = pos + 1;
  }
  if (repushed) return;  // its stamp says little about when this result left
  if (flows_[dest].nack_filter) {
    flows_[dest].nack_filter->OnDelivered(Steering() ? op.chunks.paths[chunk] : 0, op.chunks.classes[chunk], op.chunks.stamps[chunk]);
  }
  const uint64_t newest = op.chunks.stamps[chunk];
  const uint64_t reorder = w.reorder();
  while (d.gap_scan < pos) {
    const uint32_t c = mine[d.gap_scan];
    if (op.chunks.state[c] == kSent) {
      if (op.chunks.stamps[c] + reorder > newest) break;  // it may still come
      // A loss counts when it costs a repair. Under a loss bound, the lowest class is best
      // effort: the switch sheds it first, to anyone's traffic, and ε budgets for that; cutting
      // every class's window for it would hand the link to the cross traffic while the classes
      // above had room. Beyond ε the aggregator asks for it, and the repair rides class 0.
      if (op.loss_bound_ppm == 0 || op.chunks.classes[c] < wire::kNumClasses - 1) NoteLoss(op, c);
    }
    ++d.gap_scan;
  }
}

// A missing result cuts the window when it is congestion: while round trips to the endpoint stand
// above their minimum, a queue was filling (common/datapath/delay_signal.h). A loss with round
// trips where they were is random loss, which a smaller window does not make rarer: it is only
// counted. The class does not decide here: a result is missing when any worker's push of its
// chunk is, mostly another's in another class. A loss known to be in class 0 cuts whatever the
// delay (NoteClassZeroLoss). Path steering still hears of every loss: a path that loses more
// should carry less, whatever the cause.
void TransferEngine::NoteLoss(Op& op, uint32_t chunk) {
  if (!options_.adaptive_window) return;
  const uint32_t dest = op.plan->dest_of_chunk[chunk];
  if (Steering()) flows_[dest].paths->OnLoss(op.chunks.paths[chunk], op.chunks.stamps[chunk]);
  if (options_.congestion_delay > absl::ZeroDuration() && !flows_[dest].delay.Raised()) {
    ++op.stats.losses_tolerated;
    return;
  }
  if (flows_[dest].window.OnLoss(op.chunks.stamps[chunk])) ++op.stats.window_cuts;
}

// A result says a push of its chunk was lost in class 0, whoever's: a strict-priority switch
// serves class 0 first, so only a full queue loses it. That is congestion at the port every
// worker's push of the chunk crosses.
void TransferEngine::NoteClassZeroLoss(Op& op, uint32_t chunk) {
  if (!options_.adaptive_window) return;
  const uint32_t dest = op.plan->dest_of_chunk[chunk];
  if (flows_[dest].window.OnLoss(op.chunks.stamps[chunk])) ++op.stats.window_cuts;
}

// Nothing came back for a quiet spell while pushes to `dest` were out. It cuts like a loss unless
// round trips were where they were: then the results it waits for wait on losses that were not
// congestion (this worker's or another's), which the result request now repairs. A second silence
// in a row always cuts, as does the first when round trips are unknown: results that stopped
// altogether give no round trips, and a path that went black must not keep its window.
void TransferEngine::NoteSilence(Op& op, uint32_t d) {
  Dest& dest = op.dests[d];
  if (options_.congestion_delay > absl::ZeroDuration() && op.clock.repair_attempts == 0 && !flows_[d].delay.Raised()) {
    ++op.stats.losses_tolerated;
    return;
  }
  const uint32_t oldest = dest.next > dest.acked ? op.plan->chunks_by_dest[d][dest.acked] : 0;
  const bool blame = dest.next > dest.acked && op.chunks.state[oldest] == kSent && op.chunks.repushes[oldest] == 0;
  flows_[d].window.OnSilence(blame ? op.chunks.stamps[oldest] : 0);
  ++op.stats.window_cuts;
}

// Path steering (common/datapath/path_steering.h, docs/path-spraying.md): one per endpoint, over
// the transport's send paths, when the window adapts and datagrams can choose their path.
void TransferEngine::BuildPaths() {
  for (DestFlow& f : flows_) f.paths.reset();
  const size_t n = transport_->send_paths();
  // A chunk's path is kept in a byte.
  if (!options_.adaptive_window || !options_.path_steering || n < 2 || n > 256) return;
  CongestionOptions cc;
  cc.decrease = kWindowDecrease;
  cc.min = 1;
  cc.undo_threshold = true;  // these windows only share turns out: nothing overruns
  cc.max = std::max<uint32_t>(cc.initial, options_.window_chunks);
  for (DestFlow& f : flows_) f.paths.emplace(static_cast<uint32_t>(n), options_.path_burst, cc);
}

void TransferEngine::BuildNackFilters() {
  for (DestFlow& f : flows_) {
    f.nack_filter.reset();
    if (options_.nack_filter) f.nack_filter.emplace(f.paths ? f.paths->paths() : 1);
  }
}

int16_t TransferEngine::PickPath(uint32_t dest) {
  return flows_[dest].paths ? static_cast<int16_t>(flows_[dest].paths->Pick()) : -1;
}

}  // namespace dlcp
