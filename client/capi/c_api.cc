#include "client/capi/dlcp.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/client.h"
#include "client/options/client_option_table.h"
#include "common/base/build_config.h"

struct dlcp_client {
  std::unique_ptr<dlcp::Client> client;
};
struct dlcp_op {
  std::future<absl::StatusOr<dlcp::RoundStats>> future;
};

namespace {
int Fail(const absl::Status& s, char* err, size_t err_len) {
  if (err != nullptr && err_len > 0) {
    std::string m(s.message());
    size_t n = std::min(m.size(), err_len - 1);
    std::memcpy(err, m.data(), n);
    err[n] = '\0';
  }
  return s.ok() ? 0 : static_cast<int>(s.code());
}
// The caller's structs start with their size (dlcp.h): they may come from an older header, and
// must hold at least `least` bytes.
template <typename T>
absl::Status CheckSize(const T& s, size_t least, const char* name) {
  if (s.size >= least) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(name, ".size is ", s.size, ": set it to sizeof(", name, ") (", sizeof(T), " in this build)"));
}
absl::Status CheckStatsSize(const dlcp_round_stats* stats) {
  if (stats == nullptr) return absl::OkStatus();
  return CheckSize(*stats, offsetof(dlcp_round_stats, key) + sizeof(stats->key), "dlcp_round_stats");
}
// The struct's fields as option values (client/options/client_option_table.h); a zero or null
// field is left to the environment and the default.
std::map<std::string, std::string> StructValues(const dlcp_options& o) {
  std::map<std::string, std::string> v;
  v["aggregators"] = o.aggregators;
  v["job"] = o.job_name;
  v["world_size"] = absl::StrCat(o.world_size);
  v["rank"] = absl::StrCat(o.rank);
  if (o.chunk_bytes != 0) v["chunk_bytes"] = absl::StrCat(o.chunk_bytes);
  if (o.op_timeout_ms != 0) v["op_timeout_ms"] = absl::StrCat(o.op_timeout_ms);
  if (o.loss_bound != 0) v["loss_bound"] = absl::StrFormat("%.17g", o.loss_bound < 0 ? 0.0 : o.loss_bound);
  if (o.plaintext != 0) v["plaintext"] = "true";
  if (o.tls_ca != nullptr) v["tls_ca"] = o.tls_ca;
  if (o.tls_cert != nullptr) v["tls_cert"] = o.tls_cert;
  if (o.tls_key != nullptr) v["tls_key"] = o.tls_key;
  if (o.tls_server_name != nullptr) v["tls_server_name"] = o.tls_server_name;
  return v;
}

// The struct, then the settings string over it, then DLCP_* environment variables for what
// neither gave, then the defaults.
absl::StatusOr<dlcp::ClientOptions> OptionsOf(const dlcp_options& o, const char* settings) {
  std::map<std::string, std::string> values = StructValues(o);
  absl::StatusOr<std::map<std::string, std::string>> extra =
      dlcp::ParseSettingsString(settings == nullptr ? "" : settings);
  if (!extra.ok()) return extra.status();
  for (auto& [name, value] : *extra) values[name] = value;
  dlcp::ClientOptions co;
  if (absl::Status s = dlcp::ApplyClientOptions(values, dlcp::ProcessEnv, "dlcp_connect", &co); !s.ok()) return s;
  return co;
}
}  // namespace

extern "C" {

const char* dlcp_version(void) { return DLCP_VERSION; }

int dlcp_connect(const dlcp_options* o, dlcp_client** out, char* err, size_t err_len) {
  return dlcp_connect_with(o, nullptr, out, err, err_len);
}

int dlcp_connect_with(const dlcp_options* given, const char* settings, dlcp_client** out, char* err,
                      size_t err_len) {
  if (given == nullptr || out == nullptr) {
    return Fail(absl::InvalidArgumentError("dlcp_connect: null argument"), err, err_len);
  }
  absl::Status size = CheckSize(*given, offsetof(dlcp_options, job_name) + sizeof(given->job_name), "dlcp_options");
  if (!size.ok()) return Fail(size, err, err_len);
  // Only what the caller's struct holds; the rest defaults.
  dlcp_options options{};
  std::memcpy(&options, given, std::min(given->size, sizeof(options)));
  const dlcp_options* o = &options;
  if (o->aggregators == nullptr || o->job_name == nullptr) {
    return Fail(absl::InvalidArgumentError("dlcp_connect: null aggregators or job_name"), err, err_len);
  }
  absl::StatusOr<dlcp::ClientOptions> co = OptionsOf(*o, settings);
  if (!co.ok()) return Fail(co.status(), err, err_len);
  absl::StatusOr<std::unique_ptr<dlcp::Client>> c = dlcp::Client::Connect(*co);
  if (!c.ok()) return Fail(c.status(), err, err_len);
  *out = new dlcp_client{std::move(*c)};
  return 0;
}

int dlcp_allreduce_start(dlcp_client* c, uint32_t key, float* data, size_t n, dlcp_op** out, char* err,
                         size_t err_len) {
  if (c == nullptr || out == nullptr) return Fail(absl::InvalidArgumentError("dlcp_allreduce_start: null argument"), err, err_len);
  *out = new dlcp_op{c->client->AllReduce(key, absl::MakeSpan(data, n))};
  return 0;
}

int dlcp_op_wait(dlcp_op* op, uint32_t timeout_ms, dlcp_round_stats* stats, char* err, size_t err_len) {
  if (op == nullptr) return Fail(absl::InvalidArgumentError("dlcp_op_wait: null op"), err, err_len);
  if (absl::Status s = CheckStatsSize(stats); !s.ok()) return Fail(s, err, err_len);
  if (op->future.wait_for(std::chrono::milliseconds(timeout_ms)) != std::future_status::ready) {
    return Fail(absl::DeadlineExceededError("op not finished yet"), err, err_len);
  }
  absl::StatusOr<dlcp::RoundStats> r = op->future.get();
  delete op;
  if (!r.ok()) return Fail(r.status(), err, err_len);
  if (stats != nullptr) {
    dlcp_round_stats full{};
    full.key = r->key;
    full.round = r->round;
    full.time_ms = absl::ToDoubleMilliseconds(r->time);
    full.retransmits = r->retransmits;
    full.min_contributors = r->min_contributors;
    for (uint64_t v : r->left_out_by_class) full.left_out += v;
    full.droppable_total = r->droppable_total;
    full.droppable_missing = r->droppable_missing;
    // Only what the caller's struct holds: it may come from an older header.
    constexpr size_t kFirst = offsetof(dlcp_round_stats, key);
    const size_t end = std::min(stats->size, sizeof(full));
    std::memcpy(reinterpret_cast<char*>(stats) + kFirst, reinterpret_cast<const char*>(&full) + kFirst, end - kFirst);
  }
  return 0;
}

int dlcp_allreduce(dlcp_client* c, uint32_t key, float* data, size_t n, dlcp_round_stats* stats, char* err,
                   size_t err_len) {
  // Before the op starts: refused after, it would never be freed.
  if (absl::Status s = CheckStatsSize(stats); !s.ok()) return Fail(s, err, err_len);
  dlcp_op* op = nullptr;
  if (int rc = dlcp_allreduce_start(c, key, data, n, &op, err, err_len); rc != 0) return rc;
  // The op completes by its own deadline; wait without a second one.
  op->future.wait();
  return dlcp_op_wait(op, 0, stats, err, err_len);
}

uint64_t dlcp_rejects(const dlcp_client* c, const char* reason) {
  if (c == nullptr) return 0;
  uint64_t n = 0;
  for (const auto& [name, count] : c->client->Rejects()) {
    if (reason == nullptr || name == reason) n += count;
  }
  return n;
}

uint64_t dlcp_rx_overflows(const dlcp_client* c) { return c == nullptr ? 0 : c->client->ReceiveOverflows(); }
uint64_t dlcp_rx_queue_ran_dry(const dlcp_client* c) { return c == nullptr ? 0 : c->client->ReceiveQueueRanDry(); }

int dlcp_port_counter(const dlcp_client* c, const char* name, uint64_t* value, char* err, size_t err_len) {
  if (c == nullptr || name == nullptr || value == nullptr) {
    return Fail(absl::InvalidArgumentError("dlcp_port_counter: client, name and value must not be NULL"), err,
                err_len);
  }
  absl::StatusOr<uint64_t> v = c->client->PortCounter(name);
  if (!v.ok()) return Fail(v.status(), err, err_len);
  *value = *v;
  return 0;
}

int dlcp_close(dlcp_client* c, char* err, size_t err_len) {
  if (c == nullptr) return 0;
  absl::Status s = c->client->Close();
  delete c;
  return Fail(s, err, err_len);
}

}  // extern "C"
