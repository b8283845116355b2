#include "common/security/tls.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

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

}  // namespace

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

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TlsOptions& o) {
  if (absl::Status s = ValidateTlsOptions(o, /*server=*/true); !s.ok()) return s;
  if (o.plaintext) return grpc::InsecureServerCredentials();
  absl::StatusOr<std::string> cert = ReadPem(o.cert_file, "--tls-cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem(o.key_file, "--tls-key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  if (!o.ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadPem(o.ca_file, "--tls-ca");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
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
    ssl.pem_cert_chain = *cert;
    ssl.pem_private_key = *key;
  }
  out.credentials = grpc::SslCredentials(ssl);
  if (!o.server_name.empty()) out.arguments.SetSslTargetNameOverride(o.server_name);
  return out;
}

}  // namespace dlcp
