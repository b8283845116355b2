// Verification of the client certificate behind a gRPC call, for a server under mutual TLS.
//
// dlcpd's TLS handshake asks every client for a certificate and proves that the client holds its
// key, but leaves the certificate's chain to this check, made before each call is served. Refused
// in the handshake, a client would only be told "Socket closed" and dlcpd's log could not say who
// it was; refused here, the client is told why (none, another CA, expired) and dlcpd knows its
// address. Thread-safe: Verify only reads.
#pragma once

#include <openssl/x509_vfy.h>

#include <memory>
#include <string>

#include <grpcpp/security/auth_context.h>

#include "absl/status/statusor.h"

namespace dlcp {

// Why a client certificate was refused; the order is that of CertificateRefusalName.
enum class CertificateRefusal { kNone = 0, kUntrusted, kExpired, kNotYetValid, kUnusable, kCount };
// "none", "untrusted", "expired", "not_yet_valid", "unusable": a metric label.
const char* CertificateRefusalName(CertificateRefusal reason);

struct CertificateVerdict {
  bool trusted = false;
  CertificateRefusal refusal = CertificateRefusal::kNone;  // when not trusted
  std::string subject;  // the certificate's subject ("CN=worker-7"); empty without one
  std::string why;      // when not trusted: what is wrong and what to do, for the client and the log
};

class ClientCertificateVerifier {
 public:
  // Trusts the CA certificates in `ca_pem` (PEM text of --tls-ca). InvalidArgument names
  // `ca_setting` when it holds none.
  static absl::StatusOr<std::unique_ptr<ClientCertificateVerifier>> FromPem(const std::string& ca_pem,
                                                                           const std::string& ca_setting);
  ~ClientCertificateVerifier();
  ClientCertificateVerifier(const ClientCertificateVerifier&) = delete;
  ClientCertificateVerifier& operator=(const ClientCertificateVerifier&) = delete;

  // The certificate (and chain) the handshake of `auth`'s connection received, checked against
  // the CA for a TLS client's use, at the current time.
  CertificateVerdict Verify(const grpc::AuthContext& auth) const;
  // The same for PEM text: a leaf, then the intermediates it came with (may be empty).
  CertificateVerdict VerifyPem(const std::string& leaf_pem, const std::string& chain_pem) const;

 private:
  explicit ClientCertificateVerifier(X509_STORE* store) : store_(store) {}
  X509_STORE* store_;
};

}  // namespace dlcp
