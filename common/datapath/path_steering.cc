#include "common/datapath/path_steering.h"

#include <algorithm>

namespace dlcp {

PathSteering::PathSteering(uint32_t paths, uint32_t burst, const CongestionOptions& options)
    : windows_(std::max<uint32_t>(paths, 1), CongestionWindow(options)),
      turns_(std::max<uint32_t>(paths, 1), burst),
      weights_(std::max<uint32_t>(paths, 1)) {}

uint32_t PathSteering::Pick() {
  if (!turns_.InRun()) {
    for (uint32_t p = 0; p < windows_.size(); ++p) weights_[p] = windows_[p].window();
  }
  return turns_.Pick(weights_);
}

}  // namespace dlcp
