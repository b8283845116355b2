// dlcp._dlcp: the pybind11 binding of dlcp::Client (the Python package in dlcp/ wraps it).
//
// Threading: a Client's ops complete on its I/O thread, which must never wait for the GIL (a
// busy interpreter would stall every transfer). OpDone only queues the result; one completion
// thread per Client takes the GIL, fills the Handle, runs the Python callback and drops the
// references the op held. Blocking calls (connect, wait, close) release the GIL. No failure
// escapes as anything but a Python exception: a Status becomes dlcp.Error.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/options/client_option_table.h"
#include "common/base/build_config.h"
#include "common/base/log.h"

namespace py = pybind11;

namespace dlcp {
namespace {

PyObject* g_error = nullptr;  // dlcp.Error, created at import
// dlcp.errors' class per status code number, which the package registers at import; held for the
// process's life (never released, so nothing runs at interpreter exit).
PyObject* g_error_classes = nullptr;

std::string StatusText(const absl::Status& s) {
  return absl::StrCat(absl::StatusCodeToString(s.code()), ": ", s.message());
}

// Raises the status as its code's dlcp.errors class (dlcp.Error before the package registered them).
[[noreturn]] void Raise(const absl::Status& s) {
  PyObject* cls = g_error;
  if (g_error_classes != nullptr) {
    py::int_ code(static_cast<int>(s.code()));
    if (PyObject* found = PyDict_GetItem(g_error_classes, code.ptr())) cls = found;  // borrowed
  }
  PyErr_SetString(cls, StatusText(s).c_str());
  throw py::error_already_set();
}

py::dict StatsDict(const RoundStats& s) {
  py::dict d;
  d["key"] = s.key;
  d["round"] = s.round;
  d["time_s"] = absl::ToDoubleSeconds(s.time);
  d["chunks"] = s.chunks;
  d["retransmits"] = s.retransmits;
  d["result_requests"] = s.result_requests;
  d["window_cuts"] = s.window_cuts;
  d["window_undos"] = s.window_undos;
  d["losses_tolerated"] = s.losses_tolerated;
  d["nacks_deferred"] = s.nacks_deferred;
  d["min_contributors"] = s.min_contributors;
  d["bytes_sent"] = s.bytes_sent;
  d["bytes_received"] = s.bytes_received;
  d["loss_bound"] = s.loss_bound;
  d["chunks_by_class"] = std::vector<uint64_t>(s.chunks_by_class.begin(), s.chunks_by_class.end());
  d["left_out_by_class"] = std::vector<uint64_t>(s.left_out_by_class.begin(), s.left_out_by_class.end());
  d["droppable_total"] = s.droppable_total;
  d["droppable_missing"] = s.droppable_missing;
  d["bound_violations"] = s.bound_violations;
  d["time_to_stop_s"] = absl::ToDoubleSeconds(s.time_to_stop);
  d["tail_wait_s"] = absl::ToDoubleSeconds(s.tail_wait);
  d["injected_drops"] = s.injected_drops;
  d["pull_missing"] = s.pull_missing;
  d["slowest_rank"] = s.slowest_rank;
  d["slowest_lateness_s"] = absl::ToDoubleSeconds(s.slowest_lateness);
  if (!s.classes.empty()) d["classes"] = py::bytes(reinterpret_cast<const char*>(s.classes.data()), s.classes.size());
  return d;
}

// What wait() sees. Holds no Python objects, so it may die on any thread.
class Handle {
 public:
  void Set(absl::StatusOr<RoundStats> r) {
    std::lock_guard<std::mutex> lock(mu_);
    result_ = std::move(r);
    cv_.notify_all();
  }
  bool done() {
    std::lock_guard<std::mutex> lock(mu_);
    return result_.has_value();
  }
  // Caller holds the GIL; it is released while waiting.
  py::dict Wait(std::optional<double> timeout_s) {
    absl::StatusOr<RoundStats> r = absl::UnknownError("unset");
    {
      py::gil_scoped_release release;
      std::unique_lock<std::mutex> lock(mu_);
      auto ready = [&] { return result_.has_value(); };
      if (timeout_s) {
        if (!cv_.wait_for(lock, std::chrono::duration<double>(*timeout_s), ready)) {
          r = absl::DeadlineExceededError(absl::StrCat("dlcp op still running after ", *timeout_s, " s"));
        } else {
          r = *result_;
        }
      } else {
        cv_.wait(lock, ready);  // every op completes by the client's op_timeout
        r = *result_;
      }
    }
    if (!r.ok()) Raise(r.status());
    return StatsDict(*r);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<absl::StatusOr<RoundStats>> result_;
};

// One op's Python side: created and destroyed with the GIL held.
struct Pending {
  std::shared_ptr<Handle> handle;
  py::object buffer;    // keeps the memory the op writes into alive
  py::object callback;  // None or callable(stats: dict | None, error: str | None)
  absl::StatusOr<RoundStats> result = absl::UnknownError("unset");
};

class Completer {
 public:
  Completer() : thread_([this] { Run(); }) {}
  ~Completer() { Stop(); }

  void Push(Pending* p) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(p);
    cv_.notify_one();
  }
  // Drains what is queued, then joins. Caller must not hold the GIL.
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      stopping_ = true;
      cv_.notify_one();
    }
    if (std::this_thread::get_id() == thread_.get_id()) {
      thread_.detach();  // closed from inside a callback: the loop ends by itself
    } else if (thread_.joinable()) {
      thread_.join();
    }
  }

 private:
  void Run() {
    for (;;) {
      Pending* p = nullptr;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !queue_.empty() || stopping_; });
        if (queue_.empty()) return;
        p = queue_.front();
        queue_.pop_front();
      }
      if (!Py_IsInitialized()) continue;  // interpreter gone: nothing left to tell
      py::gil_scoped_acquire gil;
      p->handle->Set(p->result);
      if (!p->callback.is_none()) {
        try {
          if (p->result.ok()) {
            p->callback(StatsDict(*p->result), py::none());
          } else {
            p->callback(py::none(), StatusText(p->result.status()));
          }
        } catch (py::error_already_set& e) {
          e.discard_as_unraisable("dlcp completion callback");
        }
      }
      delete p;
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending*> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

template <typename T>
T Parsed(absl::StatusOr<T> v) {
  if (!v.ok()) Raise(v.status());
  return *v;
}

absl::Span<float> FloatSpan(const py::buffer& buffer) {
  py::buffer_info info;
  try {
    info = buffer.request(/*writable=*/true);
  } catch (py::error_already_set&) {
    Raise(absl::InvalidArgumentError("the tensor must be a writable buffer (e.g. tensor.detach().numpy())"));
  }
  if (info.itemsize != 4 || (info.format != "f" && info.format != "<f" && info.format != "=f")) {
    throw py::type_error(absl::StrCat("the tensor must hold float32, not buffer format '", info.format, "'"));
  }
  py::ssize_t expect = info.itemsize;
  for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
    if (info.shape[d] > 1 && info.strides[d] != expect) {
      Raise(absl::InvalidArgumentError("the tensor must be contiguous (call .contiguous() first)"));
    }
    expect *= info.shape[d];
  }
  return absl::MakeSpan(static_cast<float*>(info.ptr), static_cast<size_t>(info.size));
}

class PyClient {
 public:
  explicit PyClient(const ClientOptions& options) {
    absl::StatusOr<std::unique_ptr<Client>> c;
    {
      py::gil_scoped_release release;
      c = Client::Connect(options);
    }
    if (!c.ok()) Raise(c.status());
    client_ = std::move(*c);
    completer_ = std::make_unique<Completer>();
  }
  ~PyClient() {
    py::gil_scoped_release release;
    CloseNoGil();
  }

  std::shared_ptr<Handle> Submit(uint32_t key, const py::buffer& buffer, uint32_t layer, double loss_bound,
                                 int64_t root, py::object encoding, bool report_classes, py::object callback,
                                 std::string name) {
    if (!client_ || closed_) Raise(absl::FailedPreconditionError("dlcp client is closed"));
    absl::Span<float> data = FloatSpan(buffer);
    AllReduceOptions o = OpOptions(layer, loss_bound, encoding, report_classes);
    o.name = std::move(name);
    auto [handle, done] = Track(buffer, std::move(callback));
    if (root >= 0) {
      client_->BroadcastAsync(key, data, static_cast<uint32_t>(root), std::move(done));
    } else {
      client_->AllReduceAsync(key, data, o, std::move(done));
    }
    return handle;
  }

  // A tensor in CUDA device memory, by address; `keep` (the tensor) stays alive until the op ends.
  std::shared_ptr<Handle> SubmitDevice(uint32_t key, uintptr_t ptr, const std::string& dtype, uint64_t elems,
                                       int device, py::object keep, uint32_t layer, double loss_bound,
                                       py::object encoding, bool report_classes, py::object callback,
                                       std::string name) {
    if (!client_ || closed_) Raise(absl::FailedPreconditionError("dlcp client is closed"));
    DeviceTensor t{reinterpret_cast<void*>(ptr), ElemType::kF32, elems, device};
    if (dtype == "float16") {
      t.type = ElemType::kF16;
    } else if (dtype == "bfloat16") {
      t.type = ElemType::kBF16;
    } else if (dtype != "float32") {
      Raise(absl::InvalidArgumentError(absl::StrCat("device tensors hold float32, float16 or bfloat16, not ", dtype)));
    }
    AllReduceOptions o = OpOptions(layer, loss_bound, encoding, report_classes);
    o.name = std::move(name);
    auto [handle, done] = Track(std::move(keep), std::move(callback));
    client_->AllReduceDeviceAsync(key, t, o, std::move(done));
    return handle;
  }

  static AllReduceOptions OpOptions(uint32_t layer, double loss_bound, const py::object& encoding,
                                    bool report_classes) {
    AllReduceOptions o;
    o.layer = layer;
    o.loss_bound = loss_bound;
    o.report_classes = report_classes;
    if (!encoding.is_none()) o.payload_encoding = Parsed(wire::ParseEncoding(encoding.cast<std::string>()));
    return o;
  }

  // A handle for a new op, and the completion that hands its result to the completer thread.
  std::pair<std::shared_ptr<Handle>, OpDone> Track(py::object keep, py::object callback) {
    auto* p = new Pending{std::make_shared<Handle>(), std::move(keep), std::move(callback)};
    Completer* completer = completer_.get();
    OpDone done = [p, completer](absl::StatusOr<RoundStats> r) {
      p->result = std::move(r);
      completer->Push(p);
    };
    return {p->handle, std::move(done)};
  }

  void Close() {
    closed_ = true;  // under the GIL, so no submit slips in behind the completer's end
    py::gil_scoped_release release;
    CloseNoGil();
  }
  uint32_t rank() const { return Get().rank(); }
  uint32_t world_size() const { return Get().world_size(); }
  uint32_t job_id() const { return Get().job_id(); }
  std::string job() const { return Get().job_name(); }
  py::dict host_stage() const {
    const HostStageInfo info = Get().host_stage();
    py::dict d;
    d["formed"] = info.formed;
    d["ranks"] = info.ranks;
    d["local_rank"] = info.local_rank;
    d["local_size"] = info.local_size;
    d["pushes"] = info.pushes;
    d["whole_job"] = info.whole_job;
    d["why_not"] = info.why_not;
    return d;
  }
  double op_timeout_s() const { return absl::ToDoubleSeconds(Get().op_timeout()); }
  std::map<std::string, uint64_t> rejects() const { return Get().Rejects(); }
  uint64_t rx_overflows() const { return Get().ReceiveOverflows(); }
  uint64_t rx_queue_ran_dry() const { return Get().ReceiveQueueRanDry(); }
  std::map<std::string, uint64_t> port_counters() const {
    const Client& client = Get();
    absl::StatusOr<std::map<std::string, uint64_t>> counters;
    {
      py::gil_scoped_release release;  // sysfs reads
      counters = client.PortCounters();
    }
    if (!counters.ok()) Raise(counters.status());
    return *std::move(counters);
  }

 private:
  const Client& Get() const {
    if (!client_) Raise(absl::FailedPreconditionError("dlcp client is closed"));
    return *client_;
  }
  void CloseNoGil() {
    if (client_) client_->Close().IgnoreError();  // fails what is pending; the completer delivers it
    if (completer_) completer_->Stop();
  }

  std::unique_ptr<Client> client_;
  std::unique_ptr<Completer> completer_;
  bool closed_ = false;
};

// The library's log lines on their way to Python's `logging`: the sink queues them (the thread
// that logs may be an I/O thread, which must never wait for the GIL), and the package's log
// thread takes them with NextLogLines and hands them to the logger "dlcp". Bounded: when Python
// does not keep up, lines beyond kMaxLines are dropped and counted, and the count is reported
// with the next lines taken.
class LogQueue {
 public:
  static constexpr size_t kMaxLines = 4096;
  struct Line {
    int level;
    std::string file;
    int line;
    std::string message;
  };

  static LogQueue& Get() {
    static LogQueue* queue = new LogQueue;  // never destroyed: threads may log during exit
    return *queue;
  }
  static void Sink(LogLevel level, const char* file, int line, const std::string& message) {
    Get().Push(Line{static_cast<int>(level), file, line, message});
  }

  void Push(Line line) {
    std::lock_guard<std::mutex> lock(mu_);
    if (lines_.size() >= kMaxLines) {
      ++dropped_;
      return;
    }
    lines_.push_back(std::move(line));
    cv_.notify_one();
  }
  // Waits up to `timeout_s` for lines; returns them and how many were dropped since last time.
  std::pair<std::vector<Line>, uint64_t> Take(double timeout_s) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [&] { return !lines_.empty() || wake_; });
    wake_ = false;
    std::vector<Line> out(std::make_move_iterator(lines_.begin()), std::make_move_iterator(lines_.end()));
    lines_.clear();
    return {std::move(out), std::exchange(dropped_, 0)};
  }
  void Wake() {
    std::lock_guard<std::mutex> lock(mu_);
    wake_ = true;
    cv_.notify_one();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Line> lines_;
  uint64_t dropped_ = 0;
  bool wake_ = false;
};

// (level number, source file, source line, message) tuples, and the count of lines dropped.
py::tuple NextLogLines(double timeout_s) {
  std::pair<std::vector<LogQueue::Line>, uint64_t> taken;
  {
    py::gil_scoped_release release;
    taken = LogQueue::Get().Take(timeout_s);
  }
  py::list lines;
  for (const LogQueue::Line& l : taken.first) lines.append(py::make_tuple(l.level, l.file, l.line, l.message));
  return py::make_tuple(lines, taken.second);
}

const char* TypeName(ClientOption::Type type) {
  switch (type) {
    case ClientOption::Type::kBool: return "bool";
    case ClientOption::Type::kInt: return "int";
    case ClientOption::Type::kDouble: return "float";
    case ClientOption::Type::kString: return "str";
  }
  return "str";
}

std::string WithArticle(const std::string& noun) {
  return absl::StrCat(noun.find_first_of("aeiou") == 0 ? "an " : "a ", noun);
}

// Whether `v` has the Python type the option takes: bool for kBool; int (not bool) for kInt; int
// or float for kDouble; str, or a list or tuple of str and int items ("a,b", [46, 0, 0, 0]), for
// kString.
bool HasOptionType(const ClientOption& o, const py::handle& v) {
  const bool is_bool = py::isinstance<py::bool_>(v);
  switch (o.type) {
    case ClientOption::Type::kBool: return is_bool;
    case ClientOption::Type::kInt: return py::isinstance<py::int_>(v) && !is_bool;
    case ClientOption::Type::kDouble: return (py::isinstance<py::int_>(v) || py::isinstance<py::float_>(v)) && !is_bool;
    case ClientOption::Type::kString:
      if (py::isinstance<py::str>(v)) return true;
      if (!py::isinstance<py::list>(v) && !py::isinstance<py::tuple>(v)) return false;
      for (py::handle item : v) {
        if (py::isinstance<py::bool_>(item) || !(py::isinstance<py::str>(item) || py::isinstance<py::int_>(item) ||
                                                 py::isinstance<py::float_>(item))) {
          return false;
        }
      }
      return true;
  }
  return false;
}

// A keyword argument as the option table's text: True -> "true", a list -> "a,b", 5 -> "5". A
// value of another type than the option's is a TypeError naming the option.
std::string OptionText(const ClientOption& o, const py::handle& v) {
  if (!HasOptionType(o, v)) {
    const std::string type = py::str(v.get_type().attr("__name__")).cast<std::string>();
    throw py::type_error(absl::StrCat("dlcp.Client option ", o.name, " takes ", WithArticle(TypeName(o.type)),
                                      o.type == ClientOption::Type::kString ? " (or a list of items)" : "", ", not ",
                                      WithArticle(type)));
  }
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>() ? "true" : "false";
  if (py::isinstance<py::list>(v) || py::isinstance<py::tuple>(v)) {
    std::vector<std::string> parts;
    for (py::handle item : v) parts.push_back(py::str(item).cast<std::string>());
    return absl::StrJoin(parts, ",");
  }
  return py::str(v).cast<std::string>();
}

// The keyword arguments over DLCP_* environment variables over the defaults
// (client/options/client_option_table.h). None counts as not given.
ClientOptions MakeOptions(py::kwargs kw) {
  std::map<std::string, std::string> values;
  for (auto item : kw) {
    const std::string name = py::str(item.first).cast<std::string>();
    const ClientOption* row = FindClientOption(name);
    if (row == nullptr) {
      throw py::type_error(absl::StrCat("dlcp.Client got an unknown option '", name, "' (see help(dlcp.Client))"));
    }
    if (!item.second.is_none()) values[name] = OptionText(*row, item.second);
  }
  ClientOptions o;
  if (absl::Status s = ApplyClientOptions(values, ProcessEnv, "keyword argument", &o); !s.ok()) {
    throw py::value_error(std::string(s.message()));
  }
  return o;
}

// The option table for the package's docstring and tests: one dict per option.
py::list OptionTable() {
  py::list rows;
  for (const ClientOption& o : ClientOptionTable()) {
    py::dict d;
    d["name"] = o.name;
    d["env"] = o.env_name();
    d["default"] = o.default_text();
    d["type"] = TypeName(o.type);
    d["choices"] = o.choices;
    d["help"] = o.help;
    rows.append(d);
  }
  return rows;
}

}  // namespace
}  // namespace dlcp

PYBIND11_MODULE(_dlcp, m) {
  using namespace dlcp;
  m.doc() = "dlcp client binding; use the dlcp package, not this module";
  m.attr("__version__") = DLCP_VERSION;
  static py::exception<std::runtime_error> error(m, "Error", PyExc_RuntimeError);
  g_error = error.ptr();
  m.def(
      "_register_errors",
      [](py::dict classes) {
        Py_XDECREF(g_error_classes);
        g_error_classes = classes.release().ptr();
      },
      py::arg("classes"), "dlcp.errors registers its class per status code number here.");

  m.def("client_options", &OptionTable, "Every dlcp.Client option: name, env, default, choices, help.");
  m.def(
      "set_log_level",
      [](const std::string& level) {
        LogLevel parsed;
        if (absl::Status s = ParseLogLevel(level, &parsed); !s.ok()) throw py::value_error(std::string(s.message()));
        SetLogLevel(parsed);
      },
      py::arg("level"), "The least level the library logs to stderr: debug, info, warning or error.");
  m.def(
      "capture_logs",
      [](bool on) {
        SetLogSink(on ? &LogQueue::Sink : nullptr);
        if (!on) LogQueue::Get().Wake();
      },
      py::arg("on"), "Queue the library's log lines for next_log_lines (True) or write them to stderr (False).");
  m.def("next_log_lines", &NextLogLines, py::arg("timeout_s"),
        "Waits up to timeout_s for queued log lines: ([(level, file, line, message)], dropped).");
  m.def("log_level", [] {
    for (LogLevel l : {LogLevel::kDebug, LogLevel::kInfo, LogLevel::kWarning, LogLevel::kError}) {
      if (LogEnabled(l)) return std::string(LogLevelName(l));
    }
    return std::string("fatal");
  }, "The least level the library logs.");
  m.def(
      "cuda_status",
      [] {
        absl::Status s = CudaPackerAvailable();
        return s.ok() ? py::object(py::none()) : py::object(py::str(StatusText(s)));
      },
      "None when device tensors go through the CUDA packer; otherwise why they cannot.");

  py::class_<Handle, std::shared_ptr<Handle>>(m, "Handle")
      .def("done", &Handle::done)
      .def("wait", &Handle::Wait, py::arg("timeout") = py::none(),
           "Blocks (without the GIL) until the op completes; returns its stats, or raises dlcp.Error.");

  py::class_<PyClient>(m, "Client")
      .def(py::init([](py::kwargs kw) { return std::make_unique<PyClient>(MakeOptions(kw)); }))
      .def("submit", &PyClient::Submit, py::arg("key"), py::arg("buffer"), py::arg("layer") = 0,
           py::arg("loss_bound") = -1.0, py::arg("root") = -1, py::arg("encoding") = py::none(),
           py::arg("report_classes") = false, py::arg("callback") = py::none(), py::arg("name") = "")
      .def("submit_device", &PyClient::SubmitDevice, py::arg("key"), py::arg("ptr"), py::arg("dtype"),
           py::arg("elems"), py::arg("device"), py::arg("keep"), py::arg("layer") = 0, py::arg("loss_bound") = -1.0,
           py::arg("encoding") = py::none(), py::arg("report_classes") = false, py::arg("callback") = py::none(),
           py::arg("name") = "")
      .def("close", &PyClient::Close)
      .def_property_readonly("rank", &PyClient::rank)
      .def_property_readonly("world_size", &PyClient::world_size)
      .def_property_readonly("job_id", &PyClient::job_id)
      .def_property_readonly("job", &PyClient::job)
      .def("host_stage", &PyClient::host_stage)
      .def_property_readonly("op_timeout_s", &PyClient::op_timeout_s)
      .def("rejects", &PyClient::rejects)
      .def("rx_overflows", &PyClient::rx_overflows)
      .def("rx_queue_ran_dry", &PyClient::rx_queue_ran_dry)
      .def("port_counters", &PyClient::port_counters);
}
