#include "common/security/tls_flags.h"

namespace dlcp {

void DeclareTlsFlags(ConfigRegistry* c, bool server) {
  c->AddBool("plaintext", false, "serve or dial gRPC without TLS; must be chosen explicitly");
  c->AddString("tls-cert", "", server ? "PEM certificate chain of this server" : "PEM client certificate (for mTLS)");
  c->AddString("tls-key", "", "PEM private key for --tls-cert");
  c->AddString("tls-ca", "",
               server ? "PEM CA that signs client certificates; when set, clients must present one (mTLS)"
                      : "PEM CA that signs the aggregators' certificates (default: the system's roots)");
  if (!server) c->AddString("tls-server-name", "", "name to verify in the aggregators' certificates, if not the host");
}

TlsOptions TlsOptionsFromConfig(const ConfigRegistry& c, bool server) {
  TlsOptions o;
  o.plaintext = c.GetBool("plaintext");
  o.cert_file = c.GetString("tls-cert");
  o.key_file = c.GetString("tls-key");
  o.ca_file = c.GetString("tls-ca");
  if (!server) o.server_name = c.GetString("tls-server-name");
  return o;
}

}  // namespace dlcp
