// The magnitude of a chunk and the class that its magnitude rank earns, defined so that the CPU
// (class_policy.cc, the CPU packer) and the CUDA packer agree bit for bit:
//  - Each element's square is exact in double (a float has 24 significant bits). Element i of the
//    chunk adds its square to lane i % kNormLanes, in index order; then lanes fold pairwise
//    (lane j += lane j + s, for s = kNormLanes / 2, ..., 1). A GPU block of kNormLanes threads
//    does exactly this, and on a CPU the lanes vectorize.
//  - Chunks rank by that sum, largest first, lower index first among equals; a sum that is not
//    finite ranks first (a NaN or infinite gradient is the loudest signal there is).
//  - ClassAtRank turns a rank into a class with the same double operations everywhere (the CUDA
//    build turns off FMA contraction, so none is fused).
#pragma once

#include <cstdint>
#include <cstring>

#include "common/base/hd.h"

namespace dlcp {

inline constexpr uint32_t kNormLanes = 256;

DLCP_HD inline void FoldLanes(double* lanes) {
  for (uint32_t s = kNormLanes / 2; s > 0; s >>= 1) {
    for (uint32_t j = 0; j < s; ++j) lanes[j] += lanes[j + s];
  }
}

// The key that sorts chunks into rank order when sorted ascending (stable, by index).
DLCP_HD inline uint64_t MagnitudeOrderKey(double sum) {
  uint64_t bits;
  memcpy(&bits, &sum, 8);
  // A non-finite sum sorts as +infinity. Sums of squares are >= 0, so the bits of a double order
  // like the values; inverting them puts the largest first.
  if (((bits >> 52) & 0x7ffu) == 0x7ffu) bits = 0x7ff0000000000000ull;
  return ~bits;
}

// What ClassAtRank needs about one tensor.
struct ClassTiers {
  uint32_t chunks = 0;
  uint32_t reliable = 0;  // ranks below this are class 0
  bool layered = false;   // the tensor's depth is known
  double layer = 0;       // layer / num_layers, at most 1
  // Uniform policy: every chunk gets this class (kNoUniform: rank by magnitude).
  uint8_t uniform = 0xff;
  // Sized by a bound (class_policy.h): scores from class3_from up are class 3, from class2_from
  // up class 2, the rest class 1. The host computes both once, so that no device contracts the
  // arithmetic differently; otherwise thirds.
  bool by_bound = false;
  double class3_from = 1;
  double class2_from = 1;
};
inline constexpr uint8_t kNoUniform = 0xff;

// The top `reliable` ranks are class 0. The rest score their rank among themselves as a fraction
// (0: largest), averaged with the layer position when the depth is known; thirds of the score
// range are classes 1, 2 and 3, or the tiers' thresholds where a bound sized them.
DLCP_HD inline uint8_t ClassAtRank(uint32_t rank, const ClassTiers& t) {
  if (t.uniform != kNoUniform) return t.uniform;
  if (rank < t.reliable) return 0;
  const double magnitude = static_cast<double>(rank - t.reliable) / (t.chunks - t.reliable);
  const double score = t.layered ? (magnitude + t.layer) / 2 : magnitude;
  if (t.by_bound) return score >= t.class3_from ? 3 : (score >= t.class2_from ? 2 : 1);
  int tier = static_cast<int>(3 * score);
  tier = tier < 0 ? 0 : (tier > 2 ? 2 : tier);
  return static_cast<uint8_t>(1 + tier);
}

// Host helper (class_policy.cc). Tiers come from TiersFor (class_policy.h), which knows the round.
double ChunkMagnitude(const float* values, uint32_t n);

}  // namespace dlcp
