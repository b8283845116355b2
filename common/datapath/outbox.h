// Batches outgoing datagrams for one I/O thread: encodes headers into its own storage, keeps
// payload pointers (no copy), and hands full batches to the transport in one Send, grouped by
// peer (the order across peers is not kept). Owned by a single thread; payloads must stay valid
// until the next Flush().
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/transport/transport.h"
#include "common/wire/header.h"
#include "common/wire/mac.h"

namespace dlcp {

class Outbox {
 public:
  explicit Outbox(Transport* transport, size_t batch = 64, absl::Duration send_timeout = absl::Seconds(2));

  // Queues header + payload (h.payload_len bytes at `payload`); flushes when the batch is full.
  // With a key, the packet is authenticated: kFlagMac set and the MAC trailer appended.
  // `payload_digest`, if given, is wire::PayloadDigest(*key, payload) computed once by the caller.
  // `path`: OutMessage::path.
  absl::Status Add(const Address& to, const wire::Header& h, const uint8_t* payload,
                   const wire::MacKey* key = nullptr, const uint64_t* payload_digest = nullptr, int16_t path = -1);
  // The same, keeping `payload` alive inside the outbox until it is sent.
  absl::Status AddOwned(const Address& to, const wire::Header& h, std::vector<uint8_t> payload,
                        const wire::MacKey* key = nullptr, const uint64_t* payload_digest = nullptr,
                        int16_t path = -1);
  absl::Status Flush();
  size_t pending() const { return messages_.size(); }

 private:
  Transport* transport_;
  size_t batch_;
  absl::Duration send_timeout_;
  std::vector<std::array<uint8_t, wire::kHeaderSize>> headers_;
  std::vector<std::array<uint8_t, wire::kMacSize>> tags_;
  std::vector<OutMessage> messages_;
  std::vector<std::vector<uint8_t>> owned_;
};

}  // namespace dlcp
