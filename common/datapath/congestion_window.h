// How many datagrams one sender may have in flight to one peer: an AIMD window counted in
// datagrams, with TCP NewReno's rules. Below the slow-start threshold it grows by one per datagram
// acknowledged (doubling per round trip), above it by one per window's worth. A loss cuts it to
// CongestionOptions::decrease of itself (half by default), once per congestion event: a loss of a
// datagram sent before the last cut is part of the event that caused that cut (the cut has not
// had a round trip to take effect yet), so it is not cut again. A silence (nothing acknowledged
// for a while) cuts it too, without that exemption.
// A cut whose cause turns up after all (OnLate) is taken back, and optionally the slow-start
// threshold it set (CongestionOptions::undo_threshold).
//
// Why: a fixed window is either too small for the fabric, and the link idles, or too large, and
// every round overruns a switch queue or socket buffer (incast, ports shared by pushes and
// results) and repairs a share of itself; docs/congestion.md has the measurements.
//
// Single-threaded: owned by one I/O thread. Never blocks.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

namespace dlcp {

struct CongestionOptions {
  uint32_t initial = 16;  // datagrams; the first round trip's burst
  // The least reordering slack, in datagrams (reorder()): two spraying bursts. Slack that is
  // too small costs a cut until the late result undoes it; too large, and a loss is read only
  // after several windows, while the queue it overran goes on dropping (docs/congestion.md).
  uint64_t reorder = 16;
  uint32_t min = 4;       // a cut never goes below this (the repair path needs room)
  // What a cut leaves of the window: TCP NewReno's half by default (TransferEngine uses less,
  // docs/congestion.md).
  double decrease = 0.5;
  uint32_t max = 512;     // the configured window: the most ever in flight
  // An undone cut also takes back the slow-start threshold it set, once no cut since still
  // stands (as Linux's undo does), so a window only ever cut by reordering grows as fast as
  // before. Path steering's windows want that: results that ride a slow path come back late
  // and cut the windows of the fast paths their pushes took, and a fast path left in
  // congestion avoidance after each undo never grows its share. A window that bounds what is
  // in flight does not: back in slow start after every reordering, it overruns the switch
  // queue (twice the repairs on the incast bed, docs/congestion.md).
  bool undo_threshold = false;
};

class CongestionWindow {
 public:
  // Options out of range are brought into it (max >= 1, 1 <= min <= max, 0 < decrease < 1).
  explicit CongestionWindow(const CongestionOptions& options = {});

  // Datagrams that may be in flight now.
  uint32_t window() const { return static_cast<uint32_t>(cwnd_); }
  // Stamps a datagram as it leaves; OnLoss takes the stamp back.
  uint64_t Stamp() { return ++sent_; }
  // Or: a datagram left with a stamp from elsewhere (a counter several windows share, which
  // must only grow).
  void OnSent(uint64_t stamp) { sent_ = stamp > sent_ ? stamp : sent_; }
  // `n` more datagrams are known to have arrived.
  void OnAcked(uint32_t n);
  // A datagram stamped `stamp` was lost. Returns true if this started a new congestion event
  // (the window was cut).
  bool OnLoss(uint64_t stamp);
  // The datagram stamped `stamp` arrived, and neither it nor anything else on its way was ever
  // sent again. If it caused one of the recent cuts, it was late, not lost: that cut is undone
  // (returns true), and losses are inferred with more slack for reordering from now on
  // (reorder()). The caller decides what counts as sent again: a datagram taken as lost is
  // often another sender's, since the peer answers a chunk once every sender's part is in, and
  // that loss is congestion on the port they all share, not reordering.
  bool OnLate(uint64_t stamp);
  // How many datagrams sent after one must be acknowledged before a missing one counts as lost.
  uint64_t reorder() const;
  // Nothing came back for a retransmission timeout's worth of time; `oldest` is the stamp of the
  // oldest datagram still out (0: none to blame). If it turns up after all (OnLate), the cut is
  // undone: the peer was slow (descheduled, or waiting on another sender), not the path.
  void OnSilence(uint64_t oldest);

  uint64_t cuts() const { return cuts_; }
  uint64_t undone() const { return undone_; }

 private:
  void Cut(uint64_t cause);

  CongestionOptions options_;
  double cwnd_;
  double ssthresh_;
  uint64_t sent_ = 0;
  uint64_t recovery_ = 0;  // the last stamp before the latest cut
  uint64_t cuts_ = 0;
  uint64_t undone_ = 0;
  // The recent cuts, oldest overwritten first: the stamp that caused each (0: none to blame, so
  // it stands), and the window and slow-start threshold before it.
  struct Undo {
    uint64_t seq = 0;  // cuts_ once it was made; 0: free
    uint64_t cause = 0;
    bool undone = false;
    double cwnd = 0;
    double ssthresh = 0;
  };
  // What the slow-start threshold goes back to when `undone` was the last cut still standing.
  double ThresholdBefore(const Undo& undone) const;
  std::array<Undo, 8> undo_{};
  size_t next_undo_ = 0;
  uint64_t min_reorder_ = 16;  // grows each time a loss turns out to have been reordering
};

}  // namespace dlcp
