// Spreads one sender's datagrams to one peer over time, at a multiple (gain) of the rate that peer
// has recently been answering them, instead of sending each opening of the window at once.
//
// Why: a worker's window opens as results come back, and results come back in clumps (a chunk's
// result waits for the slowest worker's push, and one late push, or its repair, completes many
// chunks at once). Sent back to back from a host link many times faster than the fabric, such a
// clump lands in one shallow switch queue and overflows it, though the window is no larger than
// the path holds. TCP has the same problem with stretched acknowledgements, and Linux paces it.
//
// The rate is the best of the last few delivery samples (datagrams answered per unit time,
// measured over a few milliseconds while answers flow) times a gain above 1, so the sender can
// still grow into a path that frees up; the window, not the pacer, bounds what is in flight.
// Until the first sample, nothing is paced.
//
// Single-threaded: owned by one I/O thread. Never blocks; the caller sleeps until NextSend().
#pragma once

#include <array>
#include <cstdint>

#include "absl/time/time.h"

namespace dlcp {

struct PacerOptions {
  // Pacing rate over the delivery rate. 1.25 held bounded rounds at MTU 1500 back (7-12% at p50),
  // where 2 does not, and smooths the clumps as well (docs/congestion.md).
  double gain = 2.0;
  uint32_t burst = 8;  // datagrams that may leave back to back (a spraying burst, one GSO send)
  // The longest burst in time: at high rates, as many datagrams as leave in this long. It must
  // span the I/O thread's sleep granularity (poll: 1 ms), or the rate would be capped there.
  absl::Duration burst_time = absl::Milliseconds(2);
  absl::Duration sample = absl::Milliseconds(4);  // a delivery sample spans at least this
  // A gap between answers longer than this (and than 4 datagrams at the pacing rate) is the peer
  // or the round waiting, not the path's pace: the sample in progress is dropped.
  absl::Duration idle = absl::Milliseconds(20);
};

class Pacer {
 public:
  explicit Pacer(const PacerOptions& options = {});

  // `n` datagrams were answered (their results came back) at `now`.
  void OnDelivered(uint32_t n, absl::Time now);
  // How many datagrams may leave at `now`; effectively unlimited before the first sample.
  uint32_t Allowance(absl::Time now);
  // `n` datagrams left: at most the last Allowance, or more for datagrams that may not wait
  // (repairs), which later ones then wait for.
  void OnSent(uint32_t n);
  // When the next datagram may leave, after an Allowance of 0.
  absl::Time NextSend(absl::Time now) const;
  // Datagrams per second the pacer lets through; 0: not pacing yet.
  double rate() const;

 private:
  PacerOptions options_;
  std::array<double, 4> samples_{};  // datagrams per second; 0: none
  size_t next_sample_ = 0;
  absl::Time sample_start_ = absl::InfinitePast();
  absl::Time last_delivery_ = absl::InfinitePast();
  uint64_t sample_count_ = 0;
  double tokens_ = 0;
  absl::Time refilled_ = absl::InfinitePast();
};

}  // namespace dlcp
