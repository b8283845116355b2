#include "common/security/tls.h"

#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <memory>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/security/client_certificates.h"

namespace dlcp {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* setting) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::InvalidArgumentError(absl::StrCat("cannot read ", setting, " file '", path, "'"));
  std::stringstream ss;
  ss << f.rdbuf();
  std::string pem = ss.str();
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(setting, " file '", path, "' is not PEM"));
  }
  return pem;
}

std::string TimeText(const ASN1_TIME* t) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
  if (!bio || ASN1_TIME_print(bio.get(), t) != 1) return "?";
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

// What gRPC would only fail on later, and vaguely ("empty address list", "Socket closed" at the
// peer): a key that is not the certificate's, or a certificate outside its validity.
absl::Status CheckKeyPair(const std::string& cert_pem, const std::string& key_pem, const TlsOptions& o) {
  using Bio = std::unique_ptr<BIO, decltype(&BIO_free)>;
  Bio cert_bio(BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size())), BIO_free);
  Bio key_bio(BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size())), BIO_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr),
                                                   X509_free);
  if (!cert) return absl::InvalidArgumentError(absl::StrCat("--tls-cert file '", o.cert_file, "' holds no certificate"));
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr), EVP_PKEY_free);
  if (!key) return absl::InvalidArgumentError(absl::StrCat("--tls-key file '", o.key_file, "' holds no private key"));
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-key file '", o.key_file,
                                                   "' is not the private key of the certificate in --tls-cert file '",
                                                   o.cert_file, "'"));
  }
  if (X509_cmp_current_time(X509_get0_notAfter(cert.get())) < 0) {
    return absl::InvalidArgumentError(absl::StrCat("the certificate in --tls-cert file '", o.cert_file,
                                                   "' expired on ", TimeText(X509_get0_notAfter(cert.get()))));
  }
  if (X509_cmp_current_time(X509_get0_notBefore(cert.get())) > 0) {
    return absl::InvalidArgumentError(absl::StrCat("the certificate in --tls-cert file '", o.cert_file,
                                                   "' is not valid before ", TimeText(X509_get0_notBefore(cert.get()))));
  }
  return absl::OkStatus();
}

}  // namespace

std::string HandshakeHint(const std::string& m, bool plaintext) {
  if (absl::StrContains(m, "wrong version number") || absl::StrContains(m, "WRONG_VERSION_NUMBER")) {
    return " (the TLS handshake failed: the aggregator does not speak TLS on this port; it likely serves "
           "plaintext, so dial it with plaintext, or give dlcpd --tls-cert and --tls-key)";
  }
  if (absl::StrContains(m, "CERTIFICATE_VERIFY_FAILED") || absl::StrContains(m, "certificate verify failed")) {
    return " (the TLS handshake failed: the aggregator's certificate is not signed by the CA this client trusts "
           "(tls_ca), or does not name the host dialled (tls_server_name))";
  }
  if (!absl::StrContains(m, "Socket closed") && !absl::StrContains(m, "Connection reset")) return "";
  if (plaintext) {
    return " (the aggregator closed the connection unanswered: it likely requires TLS, so dial it with tls_ca and, "
           "for mutual TLS, tls_cert and tls_key; or it is over its connection limits, "
           "dlcpd --max-connections-per-peer)";
  }
  return " (the aggregator refused the TLS handshake: it is likely over its connection limits, dlcpd "
         "--max-connections-per-peer and --max-connections; or it is an older dlcpd that checks client "
         "certificates in the handshake, and this client gave none (tls_cert, tls_key), one from another CA, or an "
         "expired one)";
}

absl::Status ValidateTlsOptions(const TlsOptions& o, bool server) {
  const bool any_file = !o.cert_file.empty() || !o.key_file.empty() || !o.ca_file.empty();
  if (o.plaintext) {
    if (any_file) return absl::InvalidArgumentError("--plaintext excludes --tls-cert, --tls-key and --tls-ca");
    return absl::OkStatus();
  }
  if (o.cert_file.empty() != o.key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key must be given together");
  }
  if (server && o.cert_file.empty()) {
    return absl::InvalidArgumentError(
        "no TLS certificate: set --tls-cert and --tls-key (DLCP_TLS_CERT, DLCP_TLS_KEY), or --plaintext "
        "(DLCP_PLAINTEXT=true) to serve without TLS");
  }
  return absl::OkStatus();
}

absl::StatusOr<ServerSecurity> MakeServerSecurity(const TlsOptions& o) {
  if (absl::Status s = ValidateTlsOptions(o, /*server=*/true); !s.ok()) return s;
  if (o.plaintext) return ServerSecurity{grpc::InsecureServerCredentials(), nullptr};
  absl::StatusOr<std::string> cert = ReadPem(o.cert_file, "--tls-cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(o.key_file, "--tls-key");
  if (!key.ok()) return key.status();
  if (absl::Status s = CheckKeyPair(*cert, *key, o); !s.ok()) return s;
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  ServerSecurity out;
  if (!o.ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadPem(o.ca_file, "--tls-ca");
    if (!ca.ok()) return ca.status();
    absl::StatusOr<std::unique_ptr<ClientCertificateVerifier>> verifier =
        ClientCertificateVerifier::FromPem(*ca, absl::StrCat("--tls-ca file '", o.ca_file, "'"));
    if (!verifier.ok()) return verifier.status();
    out.client_certificates = std::move(*verifier);
    // The CA's name goes into the handshake's certificate request, so that a client holding
    // several certificates offers the right one; the chain is checked per call, where a refusal
    // can be explained to the client and logged with its address.
    ssl.pem_root_certs = *ca;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_BUT_DONT_VERIFY;
  }
  out.credentials = grpc::SslServerCredentials(ssl);
  return out;
}

absl::StatusOr<ChannelSecurity> MakeChannelSecurity(const TlsOptions& o) {
  if (absl::Status s = ValidateTlsOptions(o, /*server=*/false); !s.ok()) return s;
  ChannelSecurity out;
  if (o.plaintext) {
    out.credentials = grpc::InsecureChannelCredentials();
    return out;
  }
  grpc::SslCredentialsOptions ssl;  // an empty CA means the system's roots
  if (!o.ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadPem(o.ca_file, "--tls-ca");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
  }
  if (!o.cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadPem(o.cert_file, "--tls-cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPem(o.key_file, "--tls-key");
    if (!key.ok()) return key.status();
    if (absl::Status s = CheckKeyPair(*cert, *key, o); !s.ok()) return s;
    ssl.pem_cert_chain = *cert;
    ssl.pem_private_key = *key;
  }
  out.credentials = grpc::SslCredentials(ssl);
  if (!o.server_name.empty()) out.arguments.SetSslTargetNameOverride(o.server_name);
  return out;
}

}  // namespace dlcp
