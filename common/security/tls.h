// gRPC transport security for the control plane, shared by dlcpd, the client library, dlcpctl and
// dlcp-bench. TLS is the default; plaintext happens only when explicitly chosen. A server given a
// CA requires and verifies client certificates (mutual TLS). Files are read when credentials are
// made, so a Kubernetes Secret mounted as files works, and errors name the setting at fault.
#pragma once

#include <memory>
#include <string>

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include "absl/status/statusor.h"

namespace dlcp {

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

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const TlsOptions& o);

// Credentials and channel arguments for dialling `target` (host:port).
struct ChannelSecurity {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  grpc::ChannelArguments arguments;
};
absl::StatusOr<ChannelSecurity> MakeChannelSecurity(const TlsOptions& o);

// The likely cause of a failed first call, read from gRPC's message, for the caller to append:
// a TLS handshake the peer refused ("Socket closed": no client certificate, one from another
// CA, an expired one; or TLS against a plaintext port and the reverse), or empty when it is
// none of those. `plaintext`: how this side dialled.
std::string HandshakeHint(const std::string& grpc_message, bool plaintext);

}  // namespace dlcp
