#include "client/options/client_option_table.h"

#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/base/host_port.h"
#include "common/transport/transport_options.h"

namespace dlcp {
namespace {

using Type = ClientOption::Type;

template <typename T>
absl::Status OutOfRange(T min, T max) {
  return absl::InvalidArgumentError(absl::StrCat("must be in [", min, ", ", max, "]"));
}

// The same words the binaries' flags take for a boolean (absl::SimpleAtob).
absl::StatusOr<bool> ParseBool(const std::string& text) {
  bool v = false;
  if (!absl::SimpleAtob(text, &v)) return absl::InvalidArgumentError("not a boolean (true|false|1|0|yes|no)");
  return v;
}

// An integer in [min, max]; `what` names its unit in the error.
absl::StatusOr<int64_t> ParseInt(const std::string& text, int64_t min, int64_t max, const char* what) {
  int64_t v = 0;
  if (!absl::SimpleAtoi(text, &v)) return absl::InvalidArgumentError(absl::StrCat("not an integer", what));
  if (v < min || v > max) return OutOfRange(min, max);
  return v;
}

// Each builder takes an accessor, `[](auto& o) -> auto& { return o.field; }`, which serves the
// const reader and the writer alike.
template <typename F>
ClientOption Bool(std::string name, std::string help, F field) {
  ClientOption c{std::move(name), Type::kBool};
  c.help = std::move(help);
  c.get = [field](const ClientOptions& o) { return std::string(field(o) ? "true" : "false"); };
  c.set = [field](const std::string& text, ClientOptions* o) -> absl::Status {
    absl::StatusOr<bool> v = ParseBool(text);
    if (!v.ok()) return v.status();
    field(*o) = *v;
    return absl::OkStatus();
  };
  return c;
}

template <typename F>
ClientOption Int(std::string name, int64_t min, int64_t max, std::string help, F field) {
  ClientOption c{std::move(name), Type::kInt, static_cast<double>(min), static_cast<double>(max)};
  c.help = std::move(help);
  c.get = [field](const ClientOptions& o) { return absl::StrCat(+field(o)); };
  c.set = [field, min, max](const std::string& text, ClientOptions* o) -> absl::Status {
    absl::StatusOr<int64_t> v = ParseInt(text, min, max, "");
    if (!v.ok()) return v.status();
    field(*o) = static_cast<std::remove_reference_t<decltype(field(*o))>>(*v);
    return absl::OkStatus();
  };
  return c;
}

// A duration field, as whole milliseconds.
template <typename F>
ClientOption Millis(std::string name, int64_t min, int64_t max, std::string help, F field) {
  ClientOption c{std::move(name), Type::kInt, static_cast<double>(min), static_cast<double>(max)};
  c.help = std::move(help);
  c.get = [field](const ClientOptions& o) { return absl::StrCat(absl::ToInt64Milliseconds(field(o))); };
  c.set = [field, min, max](const std::string& text, ClientOptions* o) -> absl::Status {
    absl::StatusOr<int64_t> v = ParseInt(text, min, max, " (milliseconds)");
    if (!v.ok()) return v.status();
    field(*o) = absl::Milliseconds(*v);
    return absl::OkStatus();
  };
  return c;
}

template <typename F>
ClientOption Double(std::string name, double min, double max, std::string help, F field) {
  ClientOption c{std::move(name), Type::kDouble, min, max};
  c.help = std::move(help);
  c.get = [field](const ClientOptions& o) { return absl::StrCat(field(o)); };
  c.set = [field, min, max](const std::string& text, ClientOptions* o) -> absl::Status {
    double v = 0;
    if (!absl::SimpleAtod(text, &v)) return absl::InvalidArgumentError("not a number");
    if (!(v >= min && v <= max)) return OutOfRange(min, max);
    field(*o) = v;
    return absl::OkStatus();
  };
  return c;
}

template <typename F>
ClientOption Text(std::string name, std::string help, F field) {
  ClientOption c{std::move(name), Type::kString};
  c.help = std::move(help);
  c.get = [field](const ClientOptions& o) { return std::string(field(o)); };
  c.set = [field](const std::string& text, ClientOptions* o) {
    field(*o) = text;
    return absl::OkStatus();
  };
  return c;
}

// One of fixed words, parsed by `parse` (the enum's own parser); the field reads back as the word
// that parses to its value.
template <typename Parse, typename F>
ClientOption Choice(std::string name, std::vector<std::string> words, std::string help, Parse parse, F field) {
  ClientOption c{std::move(name), Type::kString};
  c.choices = absl::StrJoin(words, "|");
  c.help = std::move(help);
  c.get = [words, parse, field](const ClientOptions& o) {
    for (const std::string& w : words) {
      auto v = parse(w);
      if (v.ok() && *v == field(o)) return w;
    }
    return std::string("?");
  };
  c.set = [parse, field](const std::string& text, ClientOptions* o) -> absl::Status {
    auto v = parse(text);
    if (!v.ok()) return v.status();
    field(*o) = *v;
    return absl::OkStatus();
  };
  return c;
}

ClientOption Custom(std::string name, std::string help, std::function<std::string(const ClientOptions&)> get,
                    std::function<absl::Status(const std::string&, ClientOptions*)> set) {
  ClientOption c{std::move(name), Type::kString};
  c.help = std::move(help);
  c.get = std::move(get);
  c.set = std::move(set);
  return c;
}

ClientOption Aggregators() {
  return Custom(
      "aggregators",
      "control addresses of the job's aggregators, HOST:PORT[,HOST:PORT...]; the same list on every worker",
      [](const ClientOptions& o) { return absl::StrJoin(o.aggregators, ","); },
      [](const std::string& text, ClientOptions* o) -> absl::Status {
        std::vector<std::string> list = absl::StrSplit(text, ',', absl::SkipWhitespace());
        for (const std::string& a : list) {
          if (absl::Status s = SplitHostPort(a).status(); !s.ok()) return s;
        }
        o->aggregators = std::move(list);
        return absl::OkStatus();
      });
}

ClientOption Dscp() {
  return Custom(
      "dscp", "DSCP code point of each priority class 0,1,2,3",
      [](const ClientOptions& o) { return absl::StrJoin(o.transport.dscp, ","); },
      [](const std::string& text, ClientOptions* o) { return ParseDscpMap(text, &o->transport.dscp); });
}

ClientOption InjectDrops() {
  return Custom(
      "inject_drop_class", "tests only: drop this fraction of the worker's outgoing packets by class, C:P[,C:P]",
      [](const ClientOptions& o) {
        std::vector<std::string> parts;
        for (size_t c = 0; c < o.inject.rate.size(); ++c) {
          if (o.inject.rate[c] > 0) parts.push_back(absl::StrCat(c, ":", o.inject.rate[c]));
        }
        return absl::StrJoin(parts, ",");
      },
      [](const std::string& text, ClientOptions* o) {
        DropInjectorOptions inject = o->inject;
        inject.rate = {};
        absl::Status s = ParseClassDrops(text, &inject.rate);
        if (s.ok()) o->inject = inject;
        return s;
      });
}

std::vector<ClientOption> ConnectionRows() {
  return {
      Aggregators(),
      Text("job",
           "job name, the same on every worker of the job and on no other; empty: TORCHELASTIC_RUN_ID or "
           "MASTER_ADDR:MASTER_PORT",
           [](auto& o) -> auto& { return o.job_name; }),
      Int("world_size", 1, 65535, "workers in the job", [](auto& o) -> auto& { return o.world_size; }),
      Int("rank", 0, 65534, "this worker's rank, 0 .. world_size - 1", [](auto& o) -> auto& { return o.rank; }),
      Bool("plaintext", "dial gRPC without TLS; must be chosen explicitly",
           [](auto& o) -> auto& { return o.tls.plaintext; }),
      Text("tls_ca", "PEM CA that signs the aggregators' certificates; empty: the system's roots",
           [](auto& o) -> auto& { return o.tls.ca_file; }),
      Text("tls_cert", "PEM client certificate, for mutual TLS", [](auto& o) -> auto& { return o.tls.cert_file; }),
      Text("tls_key", "PEM private key of tls_cert", [](auto& o) -> auto& { return o.tls.key_file; }),
      Text("tls_server_name", "name to verify in the aggregators' certificates, if not the host dialled",
           [](auto& o) -> auto& { return o.tls.server_name; }),
      Millis("rpc_timeout_ms", 1, 600000, "deadline of each control call (join, heartbeat, leave)",
             [](auto& o) -> auto& { return o.rpc_timeout; }),
      Millis("heartbeat_interval_ms", 10, 60000, "how often the worker tells each aggregator it is alive",
             [](auto& o) -> auto& { return o.heartbeat_interval; }),
      Choice("on_aggregator_loss", {"fail", "remap"},
             "fail: ops fail when an aggregator dies; remap: its share moves to the others and unfinished rounds "
             "run again (docs/failure-modes.md)",
             ParseAggregatorLoss, [](auto& o) -> auto& { return o.on_aggregator_loss; }),
      Bool("host_stage",
           "sum with the job's other workers on this host in shared memory, through this host's dlcpd, and push "
           "once per host (docs/host-stage.md); false: every worker pushes its own",
           [](auto& o) -> auto& { return o.host_stage; }),
      Text("host_socket", "the Unix socket of this host's dlcpd (dlcpd --host-socket)",
           [](auto& o) -> auto& { return o.host_socket; }),
      Int("local_size", 0, 64,
          "the job's workers on this host, this one included; 0: LOCAL_WORLD_SIZE (torchrun sets it), else 1",
          [](auto& o) -> auto& { return o.local_size; }),
  };
}

std::vector<ClientOption> DataPathRows() {
  return {
      Int("chunk_bytes", 0, 65456,
          "payload bytes per chunk (one datagram); 0: fit the transport, at most 8192; the same on every worker",
          [](auto& o) -> auto& { return o.chunk_bytes; }),
      Millis("op_timeout_ms", 1, 3600000, "deadline of each all-reduce", [](auto& o) -> auto& { return o.op_timeout; }),
      Millis("repair_timeout_ms", 1, 60000,
             "the longest silence on an op before asking for what is missing (sooner once results flow)",
             [](auto& o) -> auto& { return o.repair_timeout; }),
      Int("window_bytes", 64, int64_t{1} << 32, "the most bytes unanswered per aggregator endpoint",
          [](auto& o) -> auto& { return o.window_bytes; }),
      Bool("adaptive_window", "adapt the window to loss (AIMD), up to window_bytes (docs/congestion.md)",
           [](auto& o) -> auto& { return o.adaptive_window; }),
      Bool("path_steering", "with adaptive_window and spraying: each source port's share follows its own loss",
           [](auto& o) -> auto& { return o.path_steering; }),
      Bool("nack_filter", "a NACKed push that may still be on its way goes again only when asked again",
           [](auto& o) -> auto& { return o.nack_filter; }),
      Int("congestion_delay_us", 0, 1000000,
          "a loss cuts the window only while round trips stand this far above their minimum; 0: every loss cuts",
          [](auto& o) -> auto& { return o.congestion_delay_us; }),
      Bool("pacing", "pushes to an endpoint leave spread at twice the rate its results come back",
           [](auto& o) -> auto& { return o.pacing; }),
      Choice("payload_encoding", {"f32", "f16", "bf16"}, "how values travel; f16 and bf16 halve the bytes",
             wire::ParseEncoding, [](auto& o) -> auto& { return o.payload_encoding; }),
      Text("timeline",
           "write a Chrome trace-event timeline of this worker's ops to this file, %r standing for the rank "
           "and %p for the process id (Perfetto loads it; docs/operations.md); empty: none",
           [](auto& o) -> auto& { return o.timeline; }),
  };
}

std::vector<ClientOption> BoundedLossRows() {
  return {
      Double("loss_bound", 0, 1,
             "ε: the fraction of droppable contributions a round may lose (docs/bounded-loss.md); 0: exact",
             [](auto& o) -> auto& { return o.loss_bound; }),
      Choice("class_policy", {"magnitude-layer", "uniform"}, "how chunks are given priority classes",
             ParseClassPolicyKind, [](auto& o) -> auto& { return o.class_policy.kind; }),
      Double("reliable_fraction", 0, 1, "chunks with the largest L2 norms that ride class 0",
             [](auto& o) -> auto& { return o.class_policy.reliable_fraction; }),
      Bool("rank_reliable", "rank a reliable round's chunks into classes by magnitude too; false: one class per tensor",
           [](auto& o) -> auto& { return o.class_policy.rank_reliable; }),
      Int("num_layers", 0, 1 << 20, "depth of the model, for a tensor's layer position; 0: unknown",
          [](auto& o) -> auto& { return o.num_layers; }),
      Choice("compensation", {"rescale", "zero-fill"},
             "what a chunk that lacks contributions holds: the sum scaled by world / contributors, or the plain sum",
             ParseCompensation, [](auto& o) -> auto& { return o.compensation; }),
      Bool("error_feedback", "add this worker's contributions left out of a round into its next round of the key",
           [](auto& o) -> auto& { return o.error_feedback; }),
      Choice("pull_mode", {"consistent", "bounded"},
             "consistent: every worker receives the identical aggregate; bounded: up to pull_loss_bound of the "
             "droppable results may be given up on (zeroed)",
             ParsePullMode, [](auto& o) -> auto& { return o.pull_mode; }),
      Double("pull_loss_bound", -1, 1, "ε of the bounded pull; negative: loss_bound",
             [](auto& o) -> auto& { return o.pull_loss_bound; }),
      Bool("phase_aware", "ε rises outside critical training phases, told from each tensor's gradient norm",
           [](auto& o) -> auto& { return o.phase_aware.enabled; }),
      InjectDrops(),
      Int("inject_burst", 1, 1000, "tests only: packets per inject_drop_class drop event",
          [](auto& o) -> auto& { return o.inject.burst; }),
      Int("inject_seed", 0, INT64_MAX, "tests only: seed of inject_drop_class",
          [](auto& o) -> auto& { return o.inject.seed; }),
  };
}

std::vector<ClientOption> TransportRows() {
  return {
      Choice("transport", {"auto", "udp", "rdma"},
             "data plane: rdma (RoCEv2 verbs), udp, or auto (rdma where a device is usable, else udp; logs why)",
             [](const std::string& v) -> absl::StatusOr<TransportOptions::Kind> {
               if (v == "loopback") return absl::InvalidArgumentError("loopback is in-process only (tests)");
               return ParseTransportKind(v);
             },
             [](auto& o) -> auto& { return o.transport.kind; }),
      Text("data_host", "the address aggregators send results to; empty: the one they see the worker call from",
           [](auto& o) -> auto& { return o.data_host; }),
      Text("bind_host", "the address the data plane binds; an IPv6 one runs it over IPv6",
           [](auto& o) -> auto& { return o.transport.bind_host; }),
      Dscp(),
      Bool("busy_poll", "spin on the socket instead of sleeping; only for dedicated cores",
           [](auto& o) -> auto& { return o.transport.busy_poll; }),
      Custom(
          "udp_offload", "UDP GSO on send and GRO on receive, where the kernel supports them",
          [](const ClientOptions& o) { return std::string(o.transport.udp.gso ? "true" : "false"); },
          [](const std::string& text, ClientOptions* o) -> absl::Status {
            absl::StatusOr<bool> v = ParseBool(text);
            if (!v.ok()) return v.status();
            o->transport.udp.gso = o->transport.udp.gro = *v;
            return absl::OkStatus();
          }),
      Int("spray_ports", 1, 64, "UDP source ports each endpoint sends from in turn, for ECMP; 1: off",
          [](auto& o) -> auto& { return o.transport.spray_ports; }),
      Int("spray_burst", 0, 64, "datagrams per spray port before the next; 0: 4 over 4 KiB datagrams, else 8",
          [](auto& o) -> auto& { return o.transport.spray_burst; }),
      Text("rdma_device", "RDMA device (mlx5_0, rxe0); empty: the first with an active RoCEv2 port",
           [](auto& o) -> auto& { return o.transport.rdma.device; }),
      Int("rdma_port", 1, 255, "RDMA device port", [](auto& o) -> auto& { return o.transport.rdma.port_num; }),
      Int("rdma_gid_index", -1, 65535, "RoCEv2 GID index; -1: search the GID table for the IPv4 RoCEv2 GID",
          [](auto& o) -> auto& { return o.transport.rdma.gid_index; }),
      Int("rdma_qkey", 1, 0x7fffffff, "Q_Key of every dlcp queue pair; the same on workers and aggregators",
          [](auto& o) -> auto& { return o.transport.rdma.qkey; }),
      Int("rdma_recv_slots", 64, 65536, "receive buffers per RDMA endpoint", [](auto& o) -> auto& {
        return o.transport.rdma.recv_slots;
      }),
  };
}

std::vector<ClientOption> BuildTable() {
  std::vector<ClientOption> table;
  for (auto part : {ConnectionRows(), DataPathRows(), BoundedLossRows(), TransportRows()}) {
    for (ClientOption& o : part) table.push_back(std::move(o));
  }
  return table;
}

}  // namespace

std::string ClientOption::flag() const { return absl::StrReplaceAll(name, {{"_", "-"}}); }
std::string ClientOption::env_name() const { return "DLCP_" + absl::AsciiStrToUpper(name); }

absl::Span<const ClientOption> ClientOptionTable() {
  static const std::vector<ClientOption>* table = new std::vector<ClientOption>(BuildTable());
  return *table;
}

const ClientOption* FindClientOption(const std::string& name) {
  for (const ClientOption& o : ClientOptionTable()) {
    if (o.name == name) return &o;
  }
  return nullptr;
}

absl::Status ApplyClientOptions(const std::map<std::string, std::string>& explicit_values, const EnvLookup& env,
                                const std::string& origin, ClientOptions* out) {
  for (const auto& [name, unused] : explicit_values) {
    if (FindClientOption(name) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown option '", name, "' (", origin,
                                                     "); the options are listed in docs/configuration.md"));
    }
  }
  for (const ClientOption& o : ClientOptionTable()) {
    std::string source = origin;
    std::optional<std::string> value;
    if (auto it = explicit_values.find(o.name); it != explicit_values.end()) {
      value = it->second;
    } else if (env) {
      value = env(o.env_name());
      source = "environment variable " + o.env_name();
    }
    if (!value.has_value()) continue;
    if (absl::Status s = o.set(*value, out); !s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid value '", *value, "' for option ", o.name, " (", source, "): ", s.message()));
    }
  }
  return absl::OkStatus();
}

std::optional<std::string> ProcessEnv(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

absl::StatusOr<std::string> ResolveJobName(const std::string& given, const EnvLookup& env) {
  if (!given.empty()) return given;
  const std::optional<std::string> run_id = env("TORCHELASTIC_RUN_ID");
  if (run_id.has_value() && !run_id->empty() && *run_id != "none") return *run_id;
  const std::optional<std::string> addr = env("MASTER_ADDR"), port = env("MASTER_PORT");
  if (addr.has_value() && port.has_value() && !addr->empty() && !port->empty()) {
    return absl::StrCat("torch-", *addr, ":", *port);
  }
  return absl::InvalidArgumentError(
      "no job name: set job (DLCP_JOB, dlcp-bench --job) to a name every worker of this job gives and no "
      "other job uses; under torchrun or a PyTorchJob it comes from TORCHELASTIC_RUN_ID or "
      "MASTER_ADDR:MASTER_PORT");
}

absl::StatusOr<std::map<std::string, std::string>> ParseSettingsString(const std::string& settings) {
  std::map<std::string, std::string> values;
  for (absl::string_view item : absl::StrSplit(settings, ',', absl::SkipWhitespace())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    std::string name(absl::StripAsciiWhitespace(kv.first));
    if (item.find('=') == absl::string_view::npos || name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("setting '", item, "' is not name=value"));
    }
    values[name] = std::string(absl::StripAsciiWhitespace(kv.second));
  }
  return values;
}

std::string ClientOptionsMarkdown() {
  std::string out = "| option | flag / environment | default | meaning |\n|---|---|---|---|\n";
  for (const ClientOption& o : ClientOptionTable()) {
    std::string def = o.default_text();
    std::string meaning = o.help;
    if (!o.choices.empty()) absl::StrAppend(&meaning, " (", absl::StrReplaceAll(o.choices, {{"|", ", "}}), ")");
    if (o.type == ClientOption::Type::kInt) {
      absl::StrAppend(&meaning, "; ", static_cast<int64_t>(o.min), " to ", static_cast<int64_t>(o.max));
    } else if (o.type == ClientOption::Type::kDouble) {
      absl::StrAppend(&meaning, "; ", o.min, " to ", o.max);
    }
    absl::StrAppend(&out, "| `", o.name, "` | `--", o.flag(), "`, `", o.env_name(), "` | ",
                    def.empty() ? "" : absl::StrCat("`", def, "`"), " | ", meaning, " |\n");
  }
  return out;
}

}  // namespace dlcp
