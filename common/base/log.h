// Leveled, one-line-per-event logging to stderr; plain text or JSON. Thread-safe: each line is
// written with one write(2). Configure once at start-up, before threads start.
#pragma once

#include <sstream>
#include <string>

#include "absl/status/status.h"

namespace dlcp {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

struct LogOptions {
  LogLevel min_level = LogLevel::kInfo;
  bool json = false;
  std::string component = "dlcp";
};

void ConfigureLogging(const LogOptions& options);
absl::Status ParseLogLevel(const std::string& text, LogLevel* out);
// The least level logged, from any thread at any time (a library's caller sets it).
void SetLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);
void LogLine(LogLevel level, const char* file, int line, const std::string& message);

// Where lines go instead of stderr: a binding hands them to its host's logging (the Python
// package to `logging`). Called on the thread that logs, with no lock of the logger held, for
// lines at or above the least level; it must return quickly and must not log. `file` is the source
// file's base name. nullptr sends lines to stderr again. Any thread, any time.
using LogSink = void (*)(LogLevel level, const char* file, int line, const std::string& message);
void SetLogSink(LogSink sink);
const char* LogLevelName(LogLevel level);  // "debug", "info", ...

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line) : level_(level), file_(file), line_(line) {}
  ~LogMessage() { LogLine(level_, file_, line_, stream_.str()); }
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
};

}  // namespace dlcp

// The for-loop form keeps the macro a single statement (no dangling-else) and skips formatting
// when the level is off.
#define DLCP_LOG(level)                                                               \
  for (bool dlcp_log_on_ = ::dlcp::LogEnabled(::dlcp::LogLevel::k##level); dlcp_log_on_; \
       dlcp_log_on_ = false)                                                          \
  ::dlcp::LogMessage(::dlcp::LogLevel::k##level, __FILE__, __LINE__).stream()
