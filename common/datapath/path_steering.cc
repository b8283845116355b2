#include "common/datapath/path_steering.h"

#include "common/base/check.h"

namespace dlcp {

PathSteering::PathSteering(uint32_t paths, uint32_t burst, const CongestionOptions& options)
    : windows_(paths, CongestionWindow(options)), turns_(paths, burst), weights_(paths) {
  DLCP_CHECK_GE(paths, 1u);
}

uint32_t PathSteering::Pick() {
  if (!turns_.InRun()) {
    for (uint32_t p = 0; p < windows_.size(); ++p) weights_[p] = windows_[p].window();
  }
  return turns_.Pick(weights_);
}

}  // namespace dlcp
