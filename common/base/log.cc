#include "common/base/log.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace dlcp {
namespace {
std::atomic<int> g_min_level{static_cast<int>(LogLevel::kInfo)};
std::atomic<bool> g_json{false};
std::string* g_component = new std::string("dlcp");
std::atomic<LogSink> g_sink{nullptr};

const char* Basename(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}
}  // namespace

const char* LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "debug";
    case LogLevel::kInfo: return "info";
    case LogLevel::kWarning: return "warning";
    case LogLevel::kError: return "error";
    case LogLevel::kFatal: return "fatal";
  }
  return "?";
}

namespace {
std::string JsonEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size() + 8);
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrCat("\\u00", absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
        } else {
          out += c;
        }
    }
  }
  return out;
}
}  // namespace

void SetLogSink(LogSink sink) { g_sink.store(sink, std::memory_order_release); }

void SetLogLevel(LogLevel level) { g_min_level.store(static_cast<int>(level), std::memory_order_relaxed); }

void ConfigureLogging(const LogOptions& options) {
  g_min_level = static_cast<int>(options.min_level);
  g_json = options.json;
  *g_component = options.component;
}

absl::Status ParseLogLevel(const std::string& text, LogLevel* out) {
  std::string t = absl::AsciiStrToLower(text);
  if (t == "debug") *out = LogLevel::kDebug;
  else if (t == "info") *out = LogLevel::kInfo;
  else if (t == "warning" || t == "warn") *out = LogLevel::kWarning;
  else if (t == "error") *out = LogLevel::kError;
  else return absl::InvalidArgumentError(absl::StrCat("unknown log level '", text, "' (debug|info|warning|error)"));
  return absl::OkStatus();
}

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_min_level.load(std::memory_order_relaxed); }

void LogLine(LogLevel level, const char* file, int line, const std::string& message) {
  LogSink sink = g_sink.load(std::memory_order_acquire);
  if (sink != nullptr && level != LogLevel::kFatal) {  // a fatal line goes out before the abort
    sink(level, Basename(file), line, message);
    return;
  }
  std::string ts = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
  std::string out;
  if (g_json.load(std::memory_order_relaxed)) {
    out = absl::StrCat("{\"ts\":\"", ts, "\",\"level\":\"", LogLevelName(level), "\",\"component\":\"",
                       JsonEscape(*g_component), "\",\"pid\":", getpid(), ",\"src\":\"", Basename(file), ":",
                       line, "\",\"msg\":\"", JsonEscape(message), "\"}\n");
  } else {
    out = absl::StrCat(ts, " ", LogLevelName(level), " ", *g_component, "[", getpid(), "] ", Basename(file), ":",
                       line, "] ", message, "\n");
  }
  // One write per line keeps lines whole across threads and processes sharing stderr.
  ssize_t unused = ::write(STDERR_FILENO, out.data(), out.size());
  (void)unused;
}

}  // namespace dlcp
