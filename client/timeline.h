// A timeline of this worker's all-reduce ops, as a Chrome trace-event file that Perfetto
// (ui.perfetto.dev) and chrome://tracing load (docs/operations.md, "Timeline"): per op, an async
// span from its enqueue to its result, with instants for its first and last push, its STOP, the
// NACKs it was sent and the repairs and result requests it sent.
//
// Thread-safe; a call costs a lock and an append. A writer thread of its own writes the events
// out about once a second, or as soon as half of `max_pending` wait, so the engine's I/O thread
// never writes to a file. Memory is bounded: past `max_pending` events not yet written (a writer
// that cannot keep up), events are dropped and counted (the file's last event says how many). The file is a JSON array, closed when the Timeline is destroyed; one cut
// short by a crash still loads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dlcp {

class Timeline {
 public:
  // `rank` names the trace's process, so that the files of a job's workers merge into one view.
  // In `pattern`, %r stands for the rank and %p for the process id, so that workers sharing a
  // setting (DLCP_TIMELINE=/tmp/step-%r.json) write a file each.
  static absl::StatusOr<std::unique_ptr<Timeline>> Open(const std::string& pattern, uint32_t rank,
                                                        size_t max_pending = 1 << 16);
  // With `one_of_several` (workers of a host that share the setting), a pattern with neither
  // gets "-%r" before its extension, so that each worker writes a file of its own.
  static std::string PathFor(const std::string& pattern, uint32_t rank, bool one_of_several = false);
  ~Timeline();  // Close()
  // Writes what is pending and the end of the file, and closes it; later events are dropped
  // uncounted. Idempotent.
  void Close();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // An op's span: `id` must be unique among spans open at once (key and round). `args` is a JSON
  // object's members ("\"key\":3,\"bytes\":4096"), or empty. Times are MonotonicNow()'s.
  void Begin(uint64_t id, std::string name, absl::Time t, std::string args = "");
  void Instant(uint64_t id, std::string name, absl::Time t, std::string args = "");
  void End(uint64_t id, std::string name, absl::Time t, std::string args = "");

  uint64_t dropped() const;

 private:
  struct Event {
    char phase;  // 'b', 'n' or 'e' (Chrome's async begin, instant and end)
    uint64_t id;
    int64_t ts_us;  // since the Unix epoch
    std::string name;
    std::string args;
  };
  Timeline(std::FILE* file, uint32_t rank, size_t max_pending);
  void Add(char phase, uint64_t id, std::string name, absl::Time t, std::string args);
  void WriteLoop();
  void Write(const std::vector<Event>& events);

  std::FILE* const file_;
  const uint32_t rank_;
  const size_t max_pending_;
  // Monotonic times become wall-clock ones through the pair read at Open, so that the traces of
  // workers on hosts with synchronised clocks line up.
  const absl::Time mono_origin_;
  const absl::Time wall_origin_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::vector<Event> pending_;
  uint64_t dropped_ = 0;
  bool closing_ = false;  // Close() began
  std::thread writer_;  // last: starts once the rest is set up
};

}  // namespace dlcp
