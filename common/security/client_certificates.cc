#include "common/security/client_certificates.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <grpc/grpc_security_constants.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"

namespace dlcp {
namespace {

using Bio = std::unique_ptr<BIO, decltype(&BIO_free)>;
using Cert = std::unique_ptr<X509, decltype(&X509_free)>;

Bio MemoryBio(const std::string& text) {
  return Bio(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())), BIO_free);
}

std::string BioText(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  return n > 0 ? std::string(data, static_cast<size_t>(n)) : std::string();
}

std::string SubjectOf(X509* cert) {
  Bio bio(BIO_new(BIO_s_mem()), BIO_free);
  if (!bio || X509_NAME_print_ex(bio.get(), X509_get_subject_name(cert), 0, XN_FLAG_RFC2253) < 0) return "?";
  return BioText(bio.get());
}

std::string TimeOf(const ASN1_TIME* t) {
  Bio bio(BIO_new(BIO_s_mem()), BIO_free);
  if (!bio || ASN1_TIME_print(bio.get(), t) != 1) return "?";
  return BioText(bio.get());
}

std::string Property(const grpc::AuthContext& auth, const char* name) {
  std::vector<grpc::string_ref> values = auth.FindPropertyValues(name);
  return values.empty() ? std::string() : std::string(values.front().data(), values.front().size());
}

CertificateVerdict Refused(CertificateRefusal refusal, std::string subject, std::string why) {
  return CertificateVerdict{false, refusal, std::move(subject), std::move(why)};
}

// OpenSSL's verdict on `cert`, in words a user acts on.
CertificateVerdict FromVerifyError(int error, X509* cert, const std::string& subject) {
  const std::string named = absl::StrCat("the client certificate (", subject, ")");
  switch (error) {
    case X509_V_ERR_CERT_HAS_EXPIRED:
      return Refused(CertificateRefusal::kExpired, subject,
                     absl::StrCat(named, " expired on ", TimeOf(X509_get0_notAfter(cert)), ": renew it (tls_cert)"));
    case X509_V_ERR_CERT_NOT_YET_VALID:
      return Refused(CertificateRefusal::kNotYetValid, subject,
                     absl::StrCat(named, " is not valid before ", TimeOf(X509_get0_notBefore(cert)),
                                  ": check the clocks of client and aggregator"));
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
    case X509_V_ERR_CERT_SIGNATURE_FAILURE:
      return Refused(CertificateRefusal::kUntrusted, subject,
                     absl::StrCat(named, " is not signed by the CA this aggregator trusts (dlcpd --tls-ca): give the "
                                         "client one that CA signed (tls_cert, tls_key)"));
    default:
      return Refused(CertificateRefusal::kUnusable, subject,
                     absl::StrCat(named, " cannot be used by a TLS client: ", X509_verify_cert_error_string(error)));
  }
}

}  // namespace

const char* CertificateRefusalName(CertificateRefusal reason) {
  switch (reason) {
    case CertificateRefusal::kNone: return "none";
    case CertificateRefusal::kUntrusted: return "untrusted";
    case CertificateRefusal::kExpired: return "expired";
    case CertificateRefusal::kNotYetValid: return "not_yet_valid";
    case CertificateRefusal::kUnusable: return "unusable";
    case CertificateRefusal::kCount: break;
  }
  return "?";
}

absl::StatusOr<std::unique_ptr<ClientCertificateVerifier>> ClientCertificateVerifier::FromPem(
    const std::string& ca_pem, const std::string& ca_setting) {
  X509_STORE* store = X509_STORE_new();
  if (store == nullptr) return absl::ResourceExhaustedError("no memory for a certificate store");
  std::unique_ptr<ClientCertificateVerifier> verifier(new ClientCertificateVerifier(store));
  absl::Cleanup clear_errors = [] { ERR_clear_error(); };  // the read ends in "no start line"
  Bio bio = MemoryBio(ca_pem);
  int added = 0;
  for (Cert ca(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr), X509_free); ca;
       ca.reset(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr))) {
    if (X509_STORE_add_cert(store, ca.get()) == 1) ++added;
  }
  if (added == 0) return absl::InvalidArgumentError(absl::StrCat(ca_setting, " holds no CA certificate"));
  return verifier;
}

ClientCertificateVerifier::~ClientCertificateVerifier() { X509_STORE_free(store_); }

CertificateVerdict ClientCertificateVerifier::Verify(const grpc::AuthContext& auth) const {
  return VerifyPem(Property(auth, GRPC_X509_PEM_CERT_PROPERTY_NAME),
                   Property(auth, GRPC_X509_PEM_CERT_CHAIN_PROPERTY_NAME));
}

CertificateVerdict ClientCertificateVerifier::VerifyPem(const std::string& leaf_pem,
                                                        const std::string& chain_pem) const {
  // This runs on gRPC's threads, whose TLS reads OpenSSL's per-thread error queue: reading PEM
  // until it runs out, or a failed verification, must leave nothing there.
  absl::Cleanup clear_errors = [] { ERR_clear_error(); };
  if (leaf_pem.empty()) {
    return Refused(CertificateRefusal::kNone, "",
                   "the client gave no certificate, and this aggregator requires one signed by the CA it trusts "
                   "(dlcpd --tls-ca): give the client tls_cert and tls_key");
  }
  Bio leaf_bio = MemoryBio(leaf_pem);
  Cert leaf(PEM_read_bio_X509(leaf_bio.get(), nullptr, nullptr, nullptr), X509_free);
  if (!leaf) return Refused(CertificateRefusal::kUnusable, "", "the client certificate could not be parsed");
  std::string subject = SubjectOf(leaf.get());
  // The chain gRPC reports starts with the leaf; the rest are intermediates the client sent.
  std::unique_ptr<STACK_OF(X509), void (*)(STACK_OF(X509)*)> untrusted(
      sk_X509_new_null(), [](STACK_OF(X509)* s) { sk_X509_pop_free(s, X509_free); });
  Bio chain_bio = MemoryBio(chain_pem);
  while (X509* c = PEM_read_bio_X509(chain_bio.get(), nullptr, nullptr, nullptr)) {
    if (!untrusted || sk_X509_push(untrusted.get(), c) == 0) X509_free(c);
  }
  std::unique_ptr<X509_STORE_CTX, decltype(&X509_STORE_CTX_free)> ctx(X509_STORE_CTX_new(), X509_STORE_CTX_free);
  if (!ctx || X509_STORE_CTX_init(ctx.get(), store_, leaf.get(), untrusted.get()) != 1 ||
      X509_STORE_CTX_set_default(ctx.get(), "ssl_client") != 1) {
    return Refused(CertificateRefusal::kUnusable, std::move(subject), "the client certificate could not be checked");
  }
  if (X509_verify_cert(ctx.get()) == 1) return CertificateVerdict{true, CertificateRefusal::kNone, subject, ""};
  return FromVerifyError(X509_STORE_CTX_get_error(ctx.get()), leaf.get(), subject);
}

}  // namespace dlcp
