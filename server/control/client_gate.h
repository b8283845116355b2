// The first step of every call to dlcpd's Aggregator service under mutual TLS: the client
// certificate the connection's handshake received must be one the CA vouches for
// (ClientCertificateVerifier); then Identity names the caller, for job ownership. A refused call is answered UNAUTHENTICATED saying why, counted by
// reason (dlcp_tls_clients_refused_total) and logged with the caller's address, at most
// kLinesPerSecond lines a second; then its connection is handed to `on_refusal` to be closed (its
// certificate is the connection's, so every call on it would be refused). Without mutual TLS
// every call passes. Thread-safe once serving.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include <grpcpp/server_context.h>

#include "absl/status/status.h"
#include "re2/re2.h"
#include "absl/time/time.h"
#include "common/metrics/registry.h"
#include "common/security/client_certificates.h"

namespace dlcp::server {

class ClientGate {
 public:
  static constexpr int kLinesPerSecond = 10;

  // `verifier` null: no mutual TLS. Registers the refusal counters with `metrics`.
  ClientGate(std::shared_ptr<const ClientCertificateVerifier> verifier, MetricsRegistry* metrics);

  // Called with the gRPC peer string ("ipv4:10.0.0.7:51234") of each refused call. Set before
  // serving.
  void set_on_refusal(std::function<void(const std::string& peer)> on_refusal) { on_refusal_ = std::move(on_refusal); }

  // --job-owner-pattern: where it matches one of a certificate's names, its one capture group
  // names the caller's identity instead of the certificate (say, the namespace of a SPIFFE ID,
  // so every workload of a namespace may share its jobs). Null: none. Set before serving.
  void set_owner_pattern(std::unique_ptr<const re2::RE2> pattern) { owner_pattern_ = std::move(pattern); }

  // OK, or UNAUTHENTICATED naming the reason, for call `method` on `ctx`.
  absl::Status Admit(const grpc::ServerContextBase& ctx, std::string_view method);

  // Who the caller of an admitted call is: under mutual TLS the identity its certificate proves
  // ("certificate 'worker-7'", its subject alternative names, else its common name), or the group
  // --job-owner-pattern gives it ("certificate group 'team-a'"); without a certificate its
  // address ("address 10.0.0.7").
  std::string Identity(const grpc::ServerContextBase& ctx) const;

  uint64_t refused(CertificateRefusal reason) const {
    return refused_[static_cast<size_t>(reason)].load(std::memory_order_relaxed);
  }

 private:
  // Logs the refusal unless this second's lines are spent; the next line logged says how many
  // were not.
  void Log(std::string_view peer, std::string_view method, const CertificateVerdict& verdict);

  const std::shared_ptr<const ClientCertificateVerifier> verifier_;
  std::function<void(const std::string& peer)> on_refusal_;
  std::unique_ptr<const re2::RE2> owner_pattern_;
  std::array<std::atomic<uint64_t>, static_cast<size_t>(CertificateRefusal::kCount)> refused_{};
  std::mutex log_mu_;
  absl::Time log_second_ = absl::InfinitePast();
  int lines_this_second_ = 0;
  uint64_t not_logged_ = 0;
};

}  // namespace dlcp::server
