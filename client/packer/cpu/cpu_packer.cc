#include "client/packer/cpu/cpu_packer.h"

#include "common/wire/header_layout.h"

namespace dlcp {
namespace {

class CpuPacker : public Packer {
 public:
  explicit CpuPacker(const ClassPolicyOptions& policy) : policy_(policy) {}
  const char* name() const override { return "cpu"; }

  absl::Status Pack(const PackInput& in, PackOutput* out) override {
    absl::StatusOr<PackLayout> layout = PlanPack(in, policy_);
    if (!layout.ok()) return layout.status();
    if (in.write_packets && out->packets == nullptr) return absl::InvalidArgumentError("pack: no packet buffer");
    out->magnitudes.resize(layout->chunks());
    out->classes.resize(layout->chunks());
    for (size_t t = 0; t < in.tensors.size(); ++t) PackTensorChunks(in, *layout, t, out);
    return absl::OkStatus();
  }

 private:
  // Chunk c's values as float32: straight from the tensor, or widened into widened_.
  const float* Values(const PackInput& in, uint64_t first, uint32_t n) {
    if (in.type == ElemType::kF32) return static_cast<const float*>(in.data) + first;
    widened_.resize(n);
    const uint16_t* p = static_cast<const uint16_t*>(in.data) + first;
    if (in.type == ElemType::kF16) {
      for (uint32_t i = 0; i < n; ++i) widened_[i] = wire::F16ToF32(p[i]);
    } else {
      for (uint32_t i = 0; i < n; ++i) widened_[i] = wire::BF16ToF32(p[i]);
    }
    return widened_.data();
  }

  void PackTensorChunks(const PackInput& in, const PackLayout& layout, size_t t, PackOutput* out) {
    const PackTensor& tensor = in.tensors[t];
    const wire::ChunkGeometry g{tensor.elems, in.chunk_elems};
    const uint32_t chunks = g.chunk_count(), first = layout.first_chunk[t];
    const uint32_t width = wire::EncodingWidth(in.encoding);
    uint8_t* packets = in.write_packets ? out->packets + layout.packet_offset[t] : nullptr;
    for (uint32_t c = 0; c < chunks; ++c) {
      const float* values = Values(in, tensor.offset + g.offset(c), g.elems(c));
      out->magnitudes[first + c] = ChunkMagnitude(values, g.elems(c));
      if (packets != nullptr) wire::EncodeValues(values, g.elems(c), in.encoding, packets + c * layout.stride + wire::kHeaderSize);
    }
    const absl::Span<uint8_t> classes = absl::MakeSpan(out->classes).subspan(first, chunks);
    ClassesByMagnitude(absl::MakeConstSpan(out->magnitudes).subspan(first, chunks), layout.tiers[t], classes, &keys_,
                       &order_);
    if (packets == nullptr) return;
    wire::Header h;
    h.type = wire::MsgType::kPush;
    h.job = in.job;
    h.key = tensor.key;
    h.round = tensor.round;
    h.chunk_count = chunks;
    h.tensor_elems = tensor.elems;
    h.rank = static_cast<uint16_t>(in.rank);
    h.epoch = tensor.epoch;
    h.encoding = static_cast<uint8_t>(in.encoding);
    for (uint32_t c = 0; c < chunks; ++c) {
      h.priority = classes[c];
      h.chunk = c;
      h.payload_len = g.elems(c) * width;
      wire::EncodeHeaderBytes(h, packets + c * layout.stride);
    }
  }

  ClassPolicyOptions policy_;
  std::vector<float> widened_;
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> order_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Packer>> CreateCpuPacker(const ClassPolicyOptions& policy) {
  if (absl::Status s = ValidateClassPolicy(policy); !s.ok()) return s;
  return std::make_unique<CpuPacker>(policy);
}

}  // namespace dlcp
