// Mutual TLS on the control plane, through the real binaries, with certificates made by openssl
// for this test: a CA, a server certificate for 127.0.0.1 and dlcpd.dlcp.svc, a client one.
#include <gtest/gtest.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"
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
        "printf 'extendedKeyUsage=clientAuth\\n' > client.ext;",
        "for n in server client; do openssl req $K -keyout $n.key -out $n.csr -subj /CN=$n 2>/dev/null;",
        "openssl x509 -req -in $n.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile $n.ext",
        " -out $n.crt 2>/dev/null; done;",
        // A second CA, to make a client certificate the server must not trust.
        "openssl req -x509 $K -keyout other.key -out other.crt -days 2 -subj /CN=other-ca 2>/dev/null;",
        "openssl req $K -keyout rogue.key -out rogue.csr -subj /CN=rogue 2>/dev/null;",
        "openssl x509 -req -in rogue.csr -CA other.crt -CAkey other.key -CAcreateserial -days 2",
        " -extfile client.ext -out rogue.crt 2>/dev/null");
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

  std::unique_ptr<Daemon> StartMutualTls() {
    return Daemon::Start(DLCPD_PATH, {"--tls-cert=" + F("server.crt"), "--tls-key=" + F("server.key"),
                                      "--tls-ca=" + F("ca.crt"), "--health-port=0"});
  }
  std::vector<std::string> Bench(const Daemon& d, std::vector<std::string> security) {
    std::vector<std::string> argv = {DLCP_BENCH_PATH, "--aggregators=" + d.control(), "--workers=2",
                                     "--tensor-bytes=50000", "--rounds=3", "--timeout-s=30"};
    argv.insert(argv.end(), security.begin(), security.end());
    return argv;
  }
  std::vector<std::string> ClientCert() {
    return {"--tls-ca=" + F("ca.crt"), "--tls-cert=" + F("client.crt"), "--tls-key=" + F("client.key")};
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

TEST_F(TlsTest, ClientsWithoutATrustedCertificateAreRefused) {
  auto d = StartMutualTls();
  ASSERT_NE(d, nullptr);
  for (const auto& security : std::vector<std::vector<std::string>>{
           {"--tls-ca=" + F("ca.crt")},  // no client certificate
           {"--tls-ca=" + F("ca.crt"), "--tls-cert=" + F("rogue.crt"), "--tls-key=" + F("rogue.key")},
           {"--plaintext"}}) {
    ProcessResult r = RunProcess(Bench(*d, security), absl::Seconds(40));
    EXPECT_NE(r.exit_code, 0) << security[0] << "\n" << r.out;
    EXPECT_NE(r.out.find("join job"), std::string::npos) << r.out;  // the failing step is named
  }
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

TEST_F(TlsTest, DaemonRefusesUnreadableOrMissingTlsFiles) {
  ProcessResult r = RunProcess({DLCPD_PATH, "--port=0", "--data-port=0", "--tls-cert=/nonexistent.crt",
                                "--tls-key=" + F("server.key")},
                               absl::Seconds(20));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--tls-cert"), std::string::npos) << r.out;
  r = RunProcess({DLCPD_PATH, "--port=0", "--data-port=0"}, absl::Seconds(20));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("--plaintext"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace dlcp::testing
