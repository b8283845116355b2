#include "client/host/stage_classes.h"

#include <algorithm>
#include <utility>

namespace dlcp {

absl::StatusOr<Packer*> StageClasses::PackerFor(int device) {
  std::unique_ptr<Packer>& packer = packers_[device];
  if (packer == nullptr) {
    PackerOptions po;
    po.device = device < 0 ? PackerOptions::Device::kCpu : PackerOptions::Device::kCuda;
    po.cuda_device = device < 0 ? 0 : device;
    po.policy = options_.policy;
    absl::StatusOr<std::unique_ptr<Packer>> created = CreatePacker(po);
    if (!created.ok()) return created.status();
    packer = std::move(*created);
  }
  return packer.get();
}

absl::Status StageClasses::Fill(const Values& values, uint32_t key, uint32_t layer, double loss_bound, bool report,
                                RoundStats* stats) {
  PackInput in;
  in.data = values.data;
  in.type = values.type;
  in.tensors = {PackTensor{0, static_cast<uint32_t>(values.elems), key, stats->round, layer, 0, loss_bound}};
  in.chunk_elems = options_.chunk_elems;
  in.num_layers = options_.num_layers;
  in.write_packets = false;
  absl::StatusOr<PackLayout> layout = PlanPack(in, options_.policy);
  if (!layout.ok()) return layout.status();
  std::vector<uint8_t> classes;
  if (const uint8_t uniform = layout->tiers[0].uniform; uniform != kNoUniform) {
    classes.assign(layout->chunks(), uniform);  // no value needs reading
  } else {
    absl::StatusOr<Packer*> packer = PackerFor(values.device);
    if (!packer.ok()) return packer.status();
    PackOutput out;
    if (absl::Status s = (*packer)->Pack(in, &out); !s.ok()) return s;
    classes = std::move(out.classes);
  }
  stats->chunks = classes.size();
  stats->chunks_by_class = {};
  for (uint8_t c : classes) ++stats->chunks_by_class[std::min<uint8_t>(c, 3)];
  stats->left_out_by_class = {};
  stats->droppable_total = (classes.size() - stats->chunks_by_class[0]) * uint64_t{options_.world};
  stats->droppable_missing = 0;
  stats->min_contributors = options_.world;
  if (report) stats->classes = std::move(classes);
  return absl::OkStatus();
}

}  // namespace dlcp
