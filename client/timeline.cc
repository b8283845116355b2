#include "client/timeline.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "common/base/json_text.h"

namespace dlcp {
std::string Timeline::PathFor(const std::string& pattern, uint32_t rank, bool one_of_several) {
  std::string p = pattern;
  if (one_of_several && !absl::StrContains(p, "%r") && !absl::StrContains(p, "%p")) {
    const size_t slash = p.rfind('/');
    const size_t dot = p.rfind('.');
    const bool has_extension = dot != std::string::npos && dot > 0 && (slash == std::string::npos || dot > slash + 1);
    p.insert(has_extension ? dot : p.size(), "-%r");
  }
  return absl::StrReplaceAll(p, {{"%r", absl::StrCat(rank)}, {"%p", absl::StrCat(getpid())}});
}

absl::StatusOr<std::unique_ptr<Timeline>> Timeline::Open(const std::string& pattern, uint32_t rank, size_t max_pending) {
  const std::string path = PathFor(pattern, rank);
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " cannot write its timeline to '", path,
                                                   "' (option timeline, DLCP_TIMELINE): ", std::strerror(errno)));
  }
  return std::unique_ptr<Timeline>(new Timeline(f, rank, max_pending));
}

Timeline::Timeline(std::FILE* file, uint32_t rank, size_t max_pending)
    : file_(file), rank_(rank), max_pending_(max_pending), mono_origin_(MonotonicNow()), wall_origin_(absl::Now()) {
  std::fprintf(file_,
               "[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%u,\"tid\":0,\"args\":{\"name\":\"dlcp rank %u\"}}",
               rank_, rank_);
  writer_ = std::thread([this] { WriteLoop(); });
}

Timeline::~Timeline() { Close(); }

void Timeline::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return;
    closing_ = true;
  }
  wake_.notify_all();
  writer_.join();
  std::fprintf(file_, ",\n{\"name\":\"dlcp timeline closed\",\"ph\":\"i\",\"s\":\"p\",\"pid\":%u,\"tid\":0,"
               "\"ts\":%lld,\"args\":{\"dropped_events\":%llu}}\n]\n",
               rank_, static_cast<long long>(absl::ToUnixMicros(absl::Now())),
               static_cast<unsigned long long>(dropped()));
  std::fclose(file_);
}

void Timeline::Begin(uint64_t id, std::string name, absl::Time t, std::string args) {
  Add('b', id, std::move(name), t, std::move(args));
}
void Timeline::Instant(uint64_t id, std::string name, absl::Time t, std::string args) {
  Add('n', id, std::move(name), t, std::move(args));
}
void Timeline::End(uint64_t id, std::string name, absl::Time t, std::string args) {
  Add('e', id, std::move(name), t, std::move(args));
}

uint64_t Timeline::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

void Timeline::Add(char phase, uint64_t id, std::string name, absl::Time t, std::string args) {
  const int64_t ts = absl::ToUnixMicros(wall_origin_ + (t - mono_origin_));
  bool half_full;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) return;
    if (pending_.size() >= max_pending_) {
      ++dropped_;
      return;
    }
    pending_.push_back(Event{phase, id, ts, std::move(name), std::move(args)});
    half_full = pending_.size() == max_pending_ / 2;
  }
  // A burst: the writer takes what waits now rather than at its next second, before any is dropped.
  if (half_full) wake_.notify_one();
}

void Timeline::WriteLoop() {
  std::vector<Event> batch;
  for (;;) {
    bool last;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait_for(lock, std::chrono::seconds(1), [this] { return closing_ || pending_.size() >= max_pending_ / 2; });
      batch.swap(pending_);
      last = closing_;
    }
    Write(batch);
    batch.clear();
    if (last) return;
  }
}

void Timeline::Write(const std::vector<Event>& events) {
  std::string out;
  for (const Event& e : events) {
    absl::StrAppend(&out, ",\n{\"name\":", Json(e.name), ",\"cat\":\"op\",\"ph\":\"", std::string(1, e.phase),
                    "\",\"id\":\"0x", absl::Hex(e.id), "\",\"pid\":", rank_, ",\"tid\":0,\"ts\":", e.ts_us);
    if (!e.args.empty()) absl::StrAppend(&out, ",\"args\":{", e.args, "}");
    out += "}";
  }
  if (!out.empty()) std::fwrite(out.data(), 1, out.size(), file_);
  std::fflush(file_);
}

}  // namespace dlcp
