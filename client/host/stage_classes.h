// The chunk classes and losses of a bounded-loss op through a host stage that holds the whole job
// (docs/host-stage.md, "Under a loss bound"). Such a stage has no network round to class its
// chunks or to lose any: it classes the job's sum with the job's class policy, as a stage's first
// worker classes the host's sum before it pushes it, so that every worker reports a round as on
// any other path, with nothing left out.
//
// Threading: one thread at a time (the stage's). Classing a device tensor reads it on its device
// with the CUDA packer.
#pragma once

#include <cstdint>
#include <map>
#include <memory>

#include "absl/status/status.h"
#include "client/client.h"
#include "client/packer/packer.h"
#include "common/classes/class_policy.h"

namespace dlcp {

class StageClasses {
 public:
  struct Options {
    ClassPolicyOptions policy;
    uint32_t chunk_elems = 0;  // the job's chunk_bytes / 4
    uint32_t num_layers = 0;   // ClientOptions::num_layers
    uint32_t world = 1;        // every rank contributes each chunk
  };
  // The values of a finished op: host memory (`device` < 0) or a tensor on CUDA device `device`.
  struct Values {
    const void* data = nullptr;
    ElemType type = ElemType::kF32;
    uint64_t elems = 0;
    int device = -1;
  };

  explicit StageClasses(Options options) : options_(options) {}

  // Fills `stats` for op `key` under ε `loss_bound`: its chunks and their classes (`classes` when
  // `report`), and every droppable contribution declared and none missing.
  absl::Status Fill(const Values& values, uint32_t key, uint32_t layer, double loss_bound, bool report,
                    RoundStats* stats);

 private:
  absl::StatusOr<Packer*> PackerFor(int device);

  Options options_;
  std::map<int, std::unique_ptr<Packer>> packers_;  // by CUDA device; -1: the CPU's
};

}  // namespace dlcp
