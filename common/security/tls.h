// gRPC transport security for the control plane, shared by dlcpd, the client library, dlcpctl and
// dlcp-bench. TLS is the default; plaintext happens only when explicitly chosen. A server given a
// CA requires client certificates (mutual TLS): its handshake asks for one and proves the client
// holds its key, and the server checks the certificate before each call it serves
// (ClientCertificateVerifier). Files are read when credentials are made, so a Kubernetes Secret
// mounted as files works, and errors name the setting at fault.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/status/statusor.h"

namespace dlcp {

class ClientCertificateVerifier;  // common/security/client_certificates.h (servers only)

struct TlsOptions {
  bool plaintext = false;
  std::string cert_file;    // this side's certificate chain (PEM)
  std::string key_file;     // its private key (PEM)
  std::string ca_file;      // server: CA for client certs (enables mTLS); client: CA for the server
  std::string server_name;  // client: name to verify in the server's certificate, if not the host
};

// Checks the combination: plaintext excludes TLS files; a server needs cert and key; cert and key
// come together. Says which settings to set.
absl::Status ValidateTlsOptions(const TlsOptions& o, bool server);

// A server's credentials and, under mutual TLS, the check its every call must pass first: the
// handshake leaves the client certificate's chain to it. `client_certificates` is null otherwise.
struct ServerSecurity {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  std::shared_ptr<const ClientCertificateVerifier> client_certificates;
};
absl::StatusOr<ServerSecurity> MakeServerSecurity(const TlsOptions& o);

// Credentials and channel arguments for dialling `target` (host:port).
struct ChannelSecurity {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  grpc::ChannelArguments arguments;
};
absl::StatusOr<ChannelSecurity> MakeChannelSecurity(const TlsOptions& o);

// The likely cause of a failed first call, read from gRPC's message, for the caller to append:
// a TLS handshake the peer refused ("Socket closed": over its connection limits; or TLS
// against a plaintext port and the reverse), or empty when it is none of those. (dlcpd refuses
// a client certificate after the handshake, in words of its own.) `plaintext`: how this side
// dialled.
std::string HandshakeHint(const std::string& grpc_message, bool plaintext);

}  // namespace dlcp
