#include "common/base/check.h"

#include "common/base/log.h"

namespace dlcp::internal {
void CheckFailed(const char* file, int line, const std::string& message) {
  LogLine(LogLevel::kFatal, file, line, message);
  std::abort();
}
}  // namespace dlcp::internal
