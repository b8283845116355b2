// What a round has sent of its results, per chunk: the class they ride and the class in which a
// contribution to them was lost, and when copies went out, to whom and over which path. The
// data thread reads it to choose a result's class and flags, to steer it, and to decide whether
// a worker's request for it should wait for a copy already on its way. Part of a Round; owned
// and touched by its data thread; no locking.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/time/time.h"
#include "common/wire/header.h"

namespace dlcp::server {

class ResultLedger {
 public:
  // For `chunks` chunks sent to `world` workers, of a round that began at `created`.
  ResultLedger(uint32_t world, uint32_t chunks, absl::Time created)
      : world_(world),
        chunks_(chunks),
        created_(created),
        result_class_(chunks, wire::kNumClasses - 1),
        lost_class_(chunks, wire::kNumClasses),
        out_us_(chunks, 0) {}

  // The class results of `chunk` ride: the most important class any contribution to it had.
  uint8_t result_class(uint32_t chunk) const { return result_class_[chunk]; }
  void NoteClass(uint32_t chunk, uint8_t cls) { result_class_[chunk] = std::min(result_class_[chunk], cls); }
  // A contribution to `chunk` was lost in class `cls`: it came in a repair (wire::kFlagRepaired),
  // or the round sealed without it. Its results say so, naming the most important such class.
  void NoteLost(uint32_t chunk, uint8_t cls) { lost_class_[chunk] = std::min(lost_class_[chunk], cls); }
  // That class, or wire::kNumClasses if no contribution to the chunk was lost.
  uint8_t lost_class(uint32_t chunk) const { return lost_class_[chunk]; }

  // Result steering (common/datapath/path_shares.h): the send path the latest result of `chunk`
  // to `rank` left on, -1 if none has. A worker that asks for the result again blames that path.
  int ResultPath(uint32_t rank, uint32_t chunk) const {
    return paths_.empty() ? -1 : paths_[Slot(rank, chunk)] - 1;
  }
  void NoteResultPath(uint32_t rank, uint32_t chunk, uint32_t path) {
    if (paths_.empty()) paths_.assign(size_t{world_} * chunks_, 0);  // only rounds that steer pay for it
    paths_[Slot(rank, chunk)] = static_cast<uint8_t>(path + 1);
  }

  // Whether a copy of `chunk`'s result may still be on its way to `rank`, so that sending it
  // again would only add to the congestion that delays it. A worker asks for every result it
  // lacks, including copies queued behind that congestion; answering each request in full
  // multiplied the results in flight until they crowded out the pushes the round waited for
  // (docs/congestion.md, "Results asked for again"). A copy counts as on its way for `interval`
  // after it left, and each copy sent again doubles that for the next (up to 4 times), as a
  // retransmission timeout backs off.
  void NoteResultsSent(uint32_t chunk, absl::Time now) { out_us_[chunk] = MicrosSinceCreated(now); }
  void NoteResultSentAgain(uint32_t rank, uint32_t chunk, absl::Time now) {
    // Kept from the first copy sent again on, so only rounds that repair results pay for it.
    if (again_.empty()) again_.assign(size_t{world_} * chunks_, Again{});
    Again& a = again_[Slot(rank, chunk)];
    a.us = MicrosSinceCreated(now);
    a.copies = static_cast<uint8_t>(std::min(a.copies + 1, 2));
  }
  bool ResultMayBeOnItsWay(uint32_t rank, uint32_t chunk, absl::Time now, absl::Duration interval) const {
    uint32_t last = out_us_[chunk];
    if (!again_.empty()) {
      const Again& a = again_[Slot(rank, chunk)];
      if (a.us > last) {
        last = a.us;
        interval *= 1 << a.copies;
      }
    }
    return last != 0 && now - (created_ + absl::Microseconds(last - 1)) < interval;
  }

 private:
  // When results last went out, as 1 + microseconds after created_ (0: never): per chunk to
  // everyone (out_us_), and per worker x chunk again, with how many copies went again (again_).
  struct Again {
    uint32_t us = 0;
    uint8_t copies = 0;
  };
  size_t Slot(uint32_t rank, uint32_t chunk) const { return size_t{rank} * chunks_ + chunk; }
  uint32_t MicrosSinceCreated(absl::Time now) const {
    return static_cast<uint32_t>(std::clamp<int64_t>(absl::ToInt64Microseconds(now - created_) + 1, 1, UINT32_MAX));
  }

  const uint32_t world_;
  const uint32_t chunks_;
  const absl::Time created_;
  std::vector<uint8_t> result_class_;
  std::vector<uint8_t> lost_class_;
  std::vector<uint8_t> paths_;  // world x chunks: 1 + path; 0: none (allocated on use)
  std::vector<uint32_t> out_us_;
  std::vector<Again> again_;
};

}  // namespace dlcp::server
