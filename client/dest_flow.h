// One aggregator endpoint as a worker sends to it: where it is, in which epoch, under which keys,
// and at what pace (congestion window, delay signal, pacer, path steering, NACK filter).
// TransferEngine keeps one per endpoint of its layout, made afresh with each layout; only its I/O
// thread touches them.
#pragma once

#include <cstdint>
#include <optional>

#include "common/datapath/congestion_window.h"
#include "common/datapath/delay_signal.h"
#include "common/datapath/nack_filter.h"
#include "common/datapath/pacer.h"
#include "common/datapath/path_steering.h"
#include "common/transport/address.h"
#include "common/wire/mac.h"

namespace dlcp {

struct DestFlow {
  Address addr;
  uint32_t epoch = 0;  // the job's epoch at this endpoint's aggregator
  // Into the engine's layout (EngineLayout::keys, previous_keys, worker_keys), replaced when keys
  // rotate. key: what its packets are checked with, nullptr where it does not authenticate;
  // prev_key: the key before, accepted too while set; sign_key: what pushes there are signed with.
  const wire::MacKey* key = nullptr;
  const wire::MacKey* prev_key = nullptr;
  const wire::MacKey* sign_key = nullptr;
  CongestionWindow window;
  Pacer pacer;
  // Round trips of first pushes: whether a loss came with a filling queue.
  DelaySignal delay;
  // Path steering over the transport's send paths; unset: the transport's own rotation.
  std::optional<PathSteering> paths;
  // Unset: every NACKed push goes again at once.
  std::optional<NackFilter> nack_filter;
};

}  // namespace dlcp
