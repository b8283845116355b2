// Mutual TLS on the control plane, through the real binaries, with certificates made by openssl
// for this test: a CA, a server certificate for 127.0.0.1 and dlcpd.dlcp.svc, a client one.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "dlcp/v1/control.grpc.pb.h"
#include "tests/integration/process_harness.h"

namespace dlcp::testing {
namespace {

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/dlcp-tls-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = new std::string(tmpl);
    const std::string d = *dir_;
    const std::string script = absl::StrCat(
        "set -e; cd ", d, "; K='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes';",
        "openssl req -x509 $K -keyout ca.key -out ca.crt -days 2 -subj /CN=dlcp-test-ca 2>/dev/null;",
        "printf 'subjectAltName=IP:127.0.0.1,DNS:dlcpd.dlcp.svc\\nextendedKeyUsage=serverAuth\\n' > server.ext;",
        "printf 'extendedKeyUsage=clientAuth\\n' > client.ext; cp client.ext client2.ext;",
        // client2: a second identity from the same CA.
        "for n in server client client2; do openssl req $K -keyout $n.key -out $n.csr -subj /CN=$n 2>/dev/null;",
        "openssl x509 -req -in $n.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile $n.ext",
        " -out $n.crt 2>/dev/null; done;",
        // A second CA, to make a client certificate the server must not trust.
        "openssl req -x509 $K -keyout other.key -out other.crt -days 2 -subj /CN=other-ca 2>/dev/null;",
        "openssl req $K -keyout rogue.key -out rogue.csr -subj /CN=rogue 2>/dev/null;",
        "openssl x509 -req -in rogue.csr -CA other.crt -CAkey other.key -CAcreateserial -days 2",
        " -extfile client.ext -out rogue.crt 2>/dev/null;",
        // Workloads named by SPIFFE IDs: two of namespace team-a, one of team-b.
        "for n in a1:team-a/sa/w1 a2:team-a/sa/w2 b1:team-b/sa/w1; do c=${n%%:*};",
        " printf 'subjectAltName=URI:spiffe://test/ns/%s\\nextendedKeyUsage=clientAuth\\n' ${n#*:} > $c.ext;",
        " openssl req $K -keyout $c.key -out $c.csr -subj /CN=$c 2>/dev/null;",
        " openssl x509 -req -in $c.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile $c.ext",
        " -out $c.crt 2>/dev/null; done;",
        // A client certificate from the right CA that expired yesterday.
        "openssl req $K -keyout old.key -out old.csr -subj /CN=old 2>/dev/null;",
        "openssl x509 -req -in old.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days -1 -extfile client.ext",
        " -out old.crt 2>/dev/null");
    ProcessResult r = RunProcess({"/bin/bash", "-c", script}, absl::Seconds(60));
    ASSERT_EQ(r.exit_code, 0) << r.out;
  }
  static void TearDownTestSuite() {
    if (dir_ != nullptr) {
      int unused = std::system(("rm -rf " + *dir_).c_str());
      (void)unused;
      delete dir_;
    }
  }
  static std::string F(const std::string& name) { return *dir_ + "/" + name; }

  std::unique_ptr<Daemon> StartMutualTls(std::vector<std::string> more = {}) {
    std::vector<std::string> args = {"--tls-cert=" + F("server.crt"), "--tls-key=" + F("server.key"),
                                     "--tls-ca=" + F("ca.crt"), "--health-port=0"};
    args.insert(args.end(), more.begin(), more.end());
    return Daemon::Start(DLCPD_PATH, args);
  }
  std::vector<std::string> Bench(const Daemon& d, std::vector<std::string> security) {
    std::vector<std::string> argv = {DLCP_BENCH_PATH, "--aggregators=" + d.control(), "--workers=2",
                                     "--tensor-bytes=50000", "--rounds=3", "--timeout-s=30"};
    argv.insert(argv.end(), security.begin(), security.end());
    return argv;
  }
  std::vector<std::string> ClientCert(const std::string& name = "client") {
    return {"--tls-ca=" + F("ca.crt"), "--tls-cert=" + F(name + ".crt"), "--tls-key=" + F(name + ".key")};
  }

  // `dlcpctl jobs` (with `cert`) once it lists `job`, polled for up to 20 s: a job's first
  // worker creates it as it starts.
  std::string ListedOnceItIsThere(const Daemon& d, const std::string& job, const std::string& cert) {
    std::vector<std::string> jobs = {DLCPCTL_PATH, "jobs", "--aggregators=" + d.control(), "--timeout-ms=3000"};
    for (const auto& a : ClientCert(cert)) jobs.push_back(a);
    ProcessResult listed;
    for (const absl::Time end = MonotonicNow() + absl::Seconds(20); MonotonicNow() < end;) {
      listed = RunProcess(jobs, absl::Seconds(10));
      if (listed.out.find(job) != std::string::npos) break;
      absl::SleepFor(absl::Milliseconds(100));  // polled against the deadline
    }
    return listed.out;
  }

  static std::string* dir_;
};
std::string* TlsTest::dir_ = nullptr;

TEST_F(TlsTest, MutualTlsJobIsExact) {
  auto d = StartMutualTls();
  ASSERT_NE(d, nullptr);
  ProcessResult r = RunProcess(Bench(*d, ClientCert()), absl::Seconds(40));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("results exact: yes"), std::string::npos) << r.out;
}

// Each refusal names the failing step and says what is likely wrong, on the client's side, not
// only in dlcpd's log: a certificate that is missing or from another CA (dlcpd's own check, so
// the client is told which), plaintext against TLS and the reverse, an expired certificate or a
// key that is not the certificate's (the client's check of its own files, before dialling).
TEST_F(TlsTest, ClientsWithoutATrustedCertificateAreRefusedSayingWhy) {
  auto d = StartMutualTls();
  ASSERT_NE(d, nullptr);
  auto plain = Daemon::Start(DLCPD_PATH, {});
  ASSERT_NE(plain, nullptr);
  struct Case {
    const Daemon* daemon;
    std::vector<std::string> security;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {d.get(), {"--tls-ca=" + F("ca.crt")}, "client certificate refused: the client gave no certificate"},
           {d.get(), {"--tls-ca=" + F("ca.crt"), "--tls-cert=" + F("rogue.crt"), "--tls-key=" + F("rogue.key")},
            "client certificate refused: the client certificate (CN=rogue) is not signed by the CA this aggregator "
            "trusts (dlcpd --tls-ca)"},
           {d.get(), {"--plaintext"}, "(the aggregator closed the connection unanswered: it likely requires TLS"},
           {plain.get(), {"--tls-ca=" + F("ca.crt")}, "the aggregator does not speak TLS on this port"},
           {d.get(), {"--tls-ca=" + F("ca.crt"), "--tls-cert=" + F("old.crt"), "--tls-key=" + F("old.key")},
            "the certificate in --tls-cert file '" + F("old.crt") + "' expired on "},
           {d.get(), {"--tls-ca=" + F("ca.crt"), "--tls-cert=" + F("client.crt"), "--tls-key=" + F("rogue.key")},
            "--tls-key file '" + F("rogue.key") + "' is not the private key of the certificate in --tls-cert file"}}) {
    ProcessResult r = RunProcess(Bench(*c.daemon, c.security), absl::Seconds(40));
    EXPECT_NE(r.exit_code, 0) << c.security.back() << "\n" << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.security.back() << "\n" << r.out;
  }
}

// A channel straight through gRPC with the given client certificate (empty: none), as a client
// that does not check its own files would dial.
std::shared_ptr<grpc::Channel> RawChannel(const std::string& target, const std::string& ca, const std::string& cert,
                                          const std::string& key) {
  auto read = [](const std::string& path) {
    std::ifstream f(path);
    return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  };
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = read(ca);
  if (!cert.empty()) {
    ssl.pem_cert_chain = read(cert);
    ssl.pem_private_key = read(key);
  }
  return grpc::CreateChannel(target, grpc::SslCredentials(ssl));
}

grpc::Status GetStatsOn(const std::shared_ptr<grpc::Channel>& channel) {
  auto stub = v1::Aggregator::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetStatsRequest req;
  v1::Stats resp;
  return stub->GetStats(&ctx, req, &resp);
}

grpc::Status RawGetStats(const std::string& target, const std::string& ca, const std::string& cert,
                         const std::string& key) {
  return GetStatsOn(RawChannel(target, ca, cert, key));
}

// dlcpd names each client it refused, with its address and the reason, in its log, and counts
// refusals by reason; an expired certificate (which dlcp's clients would not present) and one
// made for servers among them.
TEST_F(TlsTest, DlcpdLogsAndCountsTheClientsItRefusesByReason) {
  auto d = StartMutualTls({"--metrics-port=0"});
  ASSERT_NE(d, nullptr);
  struct Case {
    std::string cert;
    std::string reason;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{{"", "none", "the client gave no certificate"},
                                         {"rogue", "untrusted", "(CN=rogue) is not signed by the CA"},
                                         {"old", "expired", "(CN=old) expired on "},
                                         // The CA's, but for servers only (extendedKeyUsage).
                                         {"server", "unusable", "(CN=server) cannot be used by a TLS client"}}) {
    const grpc::Status s = RawGetStats(d->control(), F("ca.crt"), c.cert.empty() ? "" : F(c.cert + ".crt"),
                                       c.cert.empty() ? "" : F(c.cert + ".key"));
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << c.reason << ": " << s.error_message();
    EXPECT_NE(s.error_message().find(c.says), std::string::npos) << s.error_message();
  }
  EXPECT_TRUE(RawGetStats(d->control(), F("ca.crt"), F("client.crt"), F("client.key")).ok());
  const std::string log = d->Log();
  for (const std::string& line : {std::string("refused a GetStats call from ipv4:127.0.0.1:"),
                                  std::string("(expired): the client certificate (CN=old) expired on "),
                                  std::string("(untrusted): the client certificate (CN=rogue)"),
                                  std::string("(none): the client gave no certificate")}) {
    EXPECT_NE(log.find(line), std::string::npos) << line << "\n" << log;
  }
  const std::string metrics = HttpGet(d->metrics_port(), "/metrics", absl::Seconds(5));
  for (const char* reason : {"none", "untrusted", "expired", "unusable"}) {
    EXPECT_NE(metrics.find(absl::StrCat("dlcp_tls_clients_refused_total{reason=\"", reason, "\"} 1")),
              std::string::npos)
        << reason << "\n" << metrics;
  }
  EXPECT_NE(metrics.find("dlcp_tls_clients_refused_total{reason=\"not_yet_valid\"} 0"), std::string::npos);
}

// A refused client's connection is closed by dlcpd a second after the refusal, though the
// client keeps it: every call on it would be refused, and it would otherwise hold a connection
// until --connection-idle-timeout-ms (5 minutes).
TEST_F(TlsTest, DlcpdClosesTheConnectionOfARefusedClient) {
  auto d = StartMutualTls({"--metrics-port=0"});
  ASSERT_NE(d, nullptr);
  std::shared_ptr<grpc::Channel> kept = RawChannel(d->control(), F("ca.crt"), "", "");
  ASSERT_EQ(GetStatsOn(kept).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  const absl::Time refused = MonotonicNow();
  std::string metrics;
  for (const absl::Time end = refused + absl::Seconds(10); MonotonicNow() < end;) {
    metrics = HttpGet(d->metrics_port(), "/metrics", absl::Seconds(5));
    if (Scraped(metrics, "dlcp_control_connections_closed_total") >= 1 &&
        Scraped(metrics, "dlcp_control_connections ") == 0) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(100));  // polled against the deadline
  }
  EXPECT_EQ(Scraped(metrics, "dlcp_control_connections_closed_total{reason=\"client_certificate\"}"), 1) << metrics;
  EXPECT_EQ(Scraped(metrics, "dlcp_control_connections "), 0) << metrics;
  EXPECT_GE(MonotonicNow() - refused, absl::Milliseconds(900));  // the answer went out first
  // The client sees its connection end (a channel with no call in flight learns it only when polled).
  EXPECT_TRUE(kept->GetState(false) != GRPC_CHANNEL_READY ||
              kept->WaitForStateChange(GRPC_CHANNEL_READY, std::chrono::system_clock::now() + std::chrono::seconds(5)));
}

// A job belongs to the identity whose certificate created it: a worker with another certificate
// of the same CA cannot join it, and is told whose it is; dlcpctl shows the owner.
TEST_F(TlsTest, AJobServesOnlyTheIdentityThatCreatedIt) {
  auto d = StartMutualTls();
  ASSERT_NE(d, nullptr);
  std::vector<std::string> rank0 = Bench(*d, ClientCert("client"));
  rank0.insert(rank0.end(), {"--job=owned", "--rank=0", "--host-stage=false"});
  auto owner = BackgroundProcess::Start(rank0);
  const std::string listed = ListedOnceItIsThere(*d, "owned", "client2");
  EXPECT_NE(listed.find("certificate 'client'"), std::string::npos) << listed;
  std::vector<std::string> rank1 = Bench(*d, ClientCert("client2"));
  rank1.insert(rank1.end(), {"--job=owned", "--rank=1", "--host-stage=false"});
  ProcessResult stranger = RunProcess(rank1, absl::Seconds(40));
  EXPECT_NE(stranger.exit_code, 0) << stranger.out;
  EXPECT_NE(stranger.out.find("job 'owned' belongs to certificate 'client', which created it here, and this call "
                              "came from certificate 'client2'"),
            std::string::npos)
      << stranger.out;
}

// With --job-owner-pattern the group it captures owns a job: every certificate of namespace
// team-a (the /ns/ part of its SPIFFE ID) may join team-a's job, one of team-b may not.
TEST_F(TlsTest, AnOwnerPatternLetsAGroupOfCertificatesShareAJob) {
  auto d = StartMutualTls({"--job-owner-pattern=^spiffe://[^/]+/ns/([^/]+)/"});
  ASSERT_NE(d, nullptr);
  auto rank = [&](const std::string& cert, int r) {
    std::vector<std::string> argv = Bench(*d, ClientCert(cert));
    argv.insert(argv.end(), {"--job=shared", absl::StrCat("--rank=", r), "--host-stage=false"});
    return argv;
  };
  auto first = BackgroundProcess::Start(rank("a1", 0));
  // team-a's first worker creates the job before anyone else comes.
  EXPECT_NE(ListedOnceItIsThere(*d, "shared", "a1").find("certificate group 'team-a'"), std::string::npos);
  ProcessResult stranger = RunProcess(rank("b1", 1), absl::Seconds(40));
  EXPECT_NE(stranger.exit_code, 0) << stranger.out;
  EXPECT_NE(stranger.out.find("job 'shared' belongs to certificate group 'team-a', which created it here, and this "
                              "call came from certificate group 'team-b'"),
            std::string::npos)
      << stranger.out;
  ProcessResult colleague = RunProcess(rank("a2", 1), absl::Seconds(40));
  EXPECT_EQ(colleague.exit_code, 0) << colleague.out;
  ProcessResult creator = first->Wait(absl::Seconds(40));
  EXPECT_EQ(creator.exit_code, 0) << creator.out;
  EXPECT_NE(creator.out.find("\"exact\":true"), std::string::npos) << creator.out;
}

TEST_F(TlsTest, ServerNameIsVerified) {
  auto d = StartMutualTls();
  ASSERT_NE(d, nullptr);
  std::vector<std::string> base = {DLCPCTL_PATH, "stats", "--aggregators=" + d->control(), "--timeout-ms=3000"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = base;
    argv.insert(argv.end(), extra.begin(), extra.end());
    for (const auto& a : ClientCert()) argv.push_back(a);
    return RunProcess(argv, absl::Seconds(20));
  };
  EXPECT_EQ(with({}).exit_code, 0);  // 127.0.0.1 is in the certificate
  EXPECT_EQ(with({"--tls-server-name=dlcpd.dlcp.svc"}).exit_code, 0);
  EXPECT_EQ(with({"--tls-server-name=evil.example"}).exit_code, 1);
}

TEST_F(TlsTest, PlaintextHealthPortServesProbes) {
  auto d = StartMutualTls();
  ASSERT_NE(d, nullptr);
  ASSERT_GT(d->health_port(), 0);
  ProcessResult r = RunProcess({DLCPCTL_PATH, "health", absl::StrCat("--aggregators=127.0.0.1:", d->health_port()),
                                "--plaintext"},
                               absl::Seconds(20));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("SERVING"), std::string::npos) << r.out;
  // The health port offers nothing else: the Aggregator service is not there.
  r = RunProcess({DLCPCTL_PATH, "stats", absl::StrCat("--aggregators=127.0.0.1:", d->health_port()), "--plaintext"},
                 absl::Seconds(20));
  EXPECT_EQ(r.exit_code, 1) << r.out;
}

// A connection that never starts its TLS handshake is closed at --handshake-timeout-ms.
TEST_F(TlsTest, SilentConnectionsAreClosedAtTheHandshakeDeadline) {
  auto d = Daemon::Start(DLCPD_PATH, {"--tls-cert=" + F("server.crt"), "--tls-key=" + F("server.key"),
                                      "--tls-ca=" + F("ca.crt"), "--handshake-timeout-ms=1000"});
  ASSERT_NE(d, nullptr);
  const int port = std::stoi(d->control().substr(d->control().rfind(':') + 1));
  std::vector<int> silent;
  for (int i = 0; i < 50; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0) << std::strerror(errno);
    silent.push_back(fd);
  }
  const absl::Time start = MonotonicNow();
  for (int fd : silent) {
    pollfd p{fd, POLLIN, 0};
    const int left = static_cast<int>(absl::ToInt64Milliseconds(start + absl::Seconds(10) - MonotonicNow()));
    ASSERT_EQ(::poll(&p, 1, std::max(left, 0)), 1) << "a silent connection still open after 10 s";
    char c;
    EXPECT_LE(::recv(fd, &c, 1, 0), 0);  // closed, without a byte
    ::close(fd);
  }
  EXPECT_GE(MonotonicNow() - start, absl::Milliseconds(500));  // at the deadline, not at once
}

TEST_F(TlsTest, DaemonRefusesUnreadableOrMissingTlsFiles) {
  ProcessResult r = RunProcess({DLCPD_PATH, "--port=0", "--data-port=0", "--tls-cert=/nonexistent.crt",
                                "--tls-key=" + F("server.key")},
                               absl::Seconds(20));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--tls-cert"), std::string::npos) << r.out;
  r = RunProcess({DLCPD_PATH, "--port=0", "--data-port=0"}, absl::Seconds(20));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--plaintext"), std::string::npos) << r.out;
  r = RunProcess({DLCPD_PATH, "--port=0", "--data-port=0", "--tls-cert=" + F("server.crt"), "--tls-key=" + F("client.key")},
                 absl::Seconds(20));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--tls-key file '" + F("client.key") + "' is not the private key of the certificate"),
            std::string::npos)
      << r.out;
}

}  // namespace
}  // namespace dlcp::testing
