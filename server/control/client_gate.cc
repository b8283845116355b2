#include "server/control/client_gate.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/rpc/grpc_peer.h"
#include "common/base/clock.h"
#include "common/base/log.h"

namespace dlcp::server {

ClientGate::ClientGate(std::shared_ptr<const ClientCertificateVerifier> verifier, MetricsRegistry* metrics)
    : verifier_(std::move(verifier)) {
  for (size_t i = 0; i < refused_.size(); ++i) {
    const auto reason = static_cast<CertificateRefusal>(i);
    metrics->AddComputed("dlcp_tls_clients_refused_total", {{"reason", CertificateRefusalName(reason)}},
                         MetricsRegistry::Kind::kCounter,
                         "control calls refused under mutual TLS, by what was wrong with the client certificate "
                         "(none, untrusted: not signed by --tls-ca, expired, not_yet_valid, unusable)",
                         [this, i] { return static_cast<double>(refused_[i].load(std::memory_order_relaxed)); });
  }
}

absl::Status ClientGate::Admit(const grpc::ServerContextBase& ctx, std::string_view method) {
  if (verifier_ == nullptr) return absl::OkStatus();
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  CertificateVerdict verdict;
  if (auth == nullptr) {
    verdict = verifier_->VerifyPem("", "");
  } else {
    verdict = verifier_->Verify(*auth);
  }
  if (verdict.trusted) return absl::OkStatus();
  refused_[static_cast<size_t>(verdict.refusal)].fetch_add(1, std::memory_order_relaxed);
  const std::string peer = ctx.peer();
  Log(peer, method, verdict);
  if (on_refusal_) on_refusal_(peer);
  return absl::UnauthenticatedError(absl::StrCat("client certificate refused: ", verdict.why));
}

std::string ClientGate::Identity(const grpc::ServerContextBase& ctx) const {
  std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth && auth->IsPeerAuthenticated()) {
    std::vector<std::string> names;
    for (const grpc::string_ref& n : auth->GetPeerIdentity()) names.emplace_back(n.data(), n.size());
    for (const std::string& name : names) {
      std::string group;
      if (owner_pattern_ != nullptr && RE2::PartialMatch(name, *owner_pattern_, &group) && !group.empty()) {
        return absl::StrCat("certificate group '", group, "'");
      }
    }
    if (!names.empty()) return absl::StrCat("certificate '", absl::StrJoin(names, ","), "'");
  }
  return absl::StrCat("address ", PeerHost(ctx.peer()));
}

void ClientGate::Log(std::string_view peer, std::string_view method, const CertificateVerdict& verdict) {
  uint64_t skipped = 0;
  {
    std::lock_guard<std::mutex> lock(log_mu_);
    const absl::Time now = MonotonicNow();
    if (now - log_second_ >= absl::Seconds(1)) {
      log_second_ = now;
      lines_this_second_ = 0;
    }
    if (lines_this_second_ >= kLinesPerSecond) {
      ++not_logged_;
      return;
    }
    ++lines_this_second_;
    skipped = std::exchange(not_logged_, 0);
  }
  DLCP_LOG(Warning) << "refused a " << method << " call from " << peer << " ("
                    << CertificateRefusalName(verdict.refusal) << "): " << verdict.why
                    << (skipped > 0 ? absl::StrCat(" (", skipped, " refusals before this one not logged)") : "");
}

}  // namespace dlcp::server
