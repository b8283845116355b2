// How many datagrams one sender may have in flight to one peer: an AIMD window counted in
// datagrams, with TCP NewReno's rules. Below the slow-start threshold it grows by one per datagram
// acknowledged (doubling per round trip), above it by one per window's worth. A loss halves it,
// once per congestion event: a loss of a datagram sent before the last cut is part of the event
// that caused that cut (the cut has not had a round trip to take effect yet), so it is not cut
// again. A silence (nothing acknowledged for a while) halves it too, without that exemption.
//
// Why: the data plane's losses are mostly its own bursts overflowing a switch queue (incast, and
// ports shared by pushes and results). A fixed window either wastes the link or loses a share of
// every round and repairs it; docs/congestion.md has the measurements.
//
// Single-threaded: owned by one I/O thread. Never blocks.
#pragma once

#include <cstdint>

namespace dlcp {

struct CongestionOptions {
  uint32_t initial = 16;  // datagrams; the first round trip's burst
  uint64_t reorder = 64;  // the least reordering slack, in datagrams (reorder())
  uint32_t min = 4;       // a cut never goes below this (the repair path needs room)
  uint32_t max = 512;     // the configured window: the most ever in flight
};

class CongestionWindow {
 public:
  explicit CongestionWindow(const CongestionOptions& options = {});

  // Datagrams that may be in flight now.
  uint32_t window() const { return static_cast<uint32_t>(cwnd_); }
  // Stamps a datagram as it leaves; OnLoss takes the stamp back.
  uint64_t Stamp() { return ++sent_; }
  // `n` more datagrams are known to have arrived.
  void OnAcked(uint32_t n);
  // A datagram stamped `stamp` was lost. Returns true if this started a new congestion event
  // (the window was cut).
  bool OnLoss(uint64_t stamp);
  // The datagram stamped `stamp`, taken as lost, arrived after all, and was never sent again: it
  // was late, not lost. If it caused the latest cut, the cut is undone, and losses are inferred
  // with more slack for reordering from now on (reorder()).
  void OnLate(uint64_t stamp);
  // How many datagrams sent after one must be acknowledged before a missing one counts as lost.
  uint64_t reorder() const;
  // Nothing came back for a retransmission timeout's worth of time.
  void OnSilence();

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
  // The latest cut: the stamp that caused it (0: none to undo), and the window before it.
  uint64_t cut_cause_ = 0;
  double undo_cwnd_ = 0, undo_ssthresh_ = 0;
  uint64_t min_reorder_ = 64;  // grows each time a loss turns out to have been reordering
};

}  // namespace dlcp
