#include <gtest/gtest.h>

#include <map>

#include "common/config/registry.h"
#include "server/dlcpd/dlcpd_config.h"

namespace dlcp {
namespace {

ConfigRegistry::EnvLookup Env(std::map<std::string, std::string> env) {
  return [env](const std::string& k) -> std::optional<std::string> {
    auto it = env.find(k);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

ConfigRegistry Make() {
  ConfigRegistry c("test");
  c.AddInt("port", 7400, 0, 65535, "port");
  c.AddDouble("ratio", 0.5, 0, 1, "ratio");
  c.AddBool("fast", false, "fast");
  c.AddString("name", "x", "name", [](const std::string& v) {
    return v.empty() ? absl::InvalidArgumentError("empty") : absl::OkStatus();
  });
  return c;
}

TEST(Config, FlagsOverEnvironmentOverDefaults) {
  ConfigRegistry c = Make();
  ASSERT_TRUE(c.Load({"--port=1234", "--fast"}, Env({{"DLCP_PORT", "99"}, {"DLCP_RATIO", "0.25"}})).ok());
  EXPECT_EQ(c.GetInt("port"), 1234);
  EXPECT_DOUBLE_EQ(c.GetDouble("ratio"), 0.25);
  EXPECT_TRUE(c.GetBool("fast"));
  EXPECT_EQ(c.GetString("name"), "x");
  std::string dump = c.Dump();
  EXPECT_NE(dump.find("port=1234  # flag"), std::string::npos) << dump;
  EXPECT_NE(dump.find("ratio=0.25  # env DLCP_RATIO"), std::string::npos) << dump;
  EXPECT_NE(dump.find("name=x  # default"), std::string::npos) << dump;
}

TEST(Config, SeparateValueAndNegatedBool) {
  ConfigRegistry c = Make();
  ASSERT_TRUE(c.Load({"--port", "17", "--no-fast"}, Env({{"DLCP_FAST", "true"}})).ok());
  EXPECT_EQ(c.GetInt("port"), 17);
  EXPECT_FALSE(c.GetBool("fast"));
}

TEST(Config, ErrorsNameTheSettingAndSource) {
  {
    ConfigRegistry c = Make();
    absl::Status s = c.Load({"--port=70000"}, Env({}));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("--port"), std::string::npos) << s;
    EXPECT_NE(s.message().find("[0, 65535]"), std::string::npos) << s;
  }
  {
    ConfigRegistry c = Make();
    absl::Status s = c.Load({}, Env({{"DLCP_RATIO", "abc"}}));
    EXPECT_NE(s.message().find("env DLCP_RATIO"), std::string::npos) << s;
  }
  {
    ConfigRegistry c = Make();
    EXPECT_FALSE(c.Load({"--nope=1"}, Env({})).ok());
  }
  {
    ConfigRegistry c = Make();
    absl::Status s = c.Load({"--name="}, Env({}));
    EXPECT_NE(s.message().find("--name"), std::string::npos) << s;
  }
  {
    ConfigRegistry c = Make();
    EXPECT_FALSE(c.Load({"--fast=maybe"}, Env({})).ok());
  }
  {
    ConfigRegistry c = Make();
    EXPECT_FALSE(c.Load({"--port"}, Env({})).ok());  // needs a value
  }
}

TEST(DlcpdConfig, DefaultsAreValidAndCrossChecksRefuse) {
  {
    ConfigRegistry c("dlcpd");
    server::DeclareDlcpdFlags(&c);
    ASSERT_TRUE(c.Load({}, Env({})).ok());
    auto o = server::DlcpdOptionsFromConfig(c);  // no TLS and no --plaintext: refused, saying how
    EXPECT_FALSE(o.ok());
    EXPECT_NE(o.status().message().find("--tls-cert"), std::string::npos) << o.status();
    EXPECT_NE(o.status().message().find("--plaintext"), std::string::npos) << o.status();
  }
  {
    ConfigRegistry c("dlcpd");
    server::DeclareDlcpdFlags(&c);
    ASSERT_TRUE(c.Load({"--plaintext"}, Env({})).ok());
    auto o = server::DlcpdOptionsFromConfig(c);
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(o->control_port, 7400);
    EXPECT_EQ(o->data.transport.dscp[0], 46);
  }
  {
    ConfigRegistry c("dlcpd");
    server::DeclareDlcpdFlags(&c);
    ASSERT_TRUE(c.Load({}, Env({{"DLCP_TLS_CERT", "/x.crt"}, {"DLCP_TLS_KEY", "/x.key"}, {"DLCP_TLS_CA", "/ca"}})).ok());
    auto o = server::DlcpdOptionsFromConfig(c);
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(o->tls.ca_file, "/ca");
  }
  {
    // A job budget no job could use: over the cap of all jobs together.
    ConfigRegistry c("dlcpd");
    server::DeclareDlcpdFlags(&c);
    ASSERT_TRUE(c.Load({"--plaintext", "--max-job-bytes=8589934592"}, Env({{"DLCP_MAX_MEMORY_BYTES", "4294967296"}})).ok());
    auto o = server::DlcpdOptionsFromConfig(c);
    ASSERT_FALSE(o.ok());
    EXPECT_NE(o.status().message().find("--max-job-bytes 8589934592 exceeds --max-memory-bytes 4294967296"),
              std::string::npos)
        << o.status();
  }
  {
    ConfigRegistry c("dlcpd");
    server::DeclareDlcpdFlags(&c);
    ASSERT_TRUE(c.Load({"--plaintext", "--tls-cert=/x"}, Env({})).ok());
    EXPECT_FALSE(server::DlcpdOptionsFromConfig(c).ok());
  }
  {
    ConfigRegistry c("dlcpd");
    server::DeclareDlcpdFlags(&c);
    ASSERT_TRUE(c.Load({"--tls-cert=/x"}, Env({})).ok());  // key missing
    EXPECT_FALSE(server::DlcpdOptionsFromConfig(c).ok());
  }
  {
    ConfigRegistry c("dlcpd");
    server::DeclareDlcpdFlags(&c);
    ASSERT_TRUE(c.Load({"--plaintext", "--repair-timeout-ms=1000", "--round-timeout-ms=2000"}, Env({})).ok());
    EXPECT_FALSE(server::DlcpdOptionsFromConfig(c).ok());
  }
  {
    ConfigRegistry c("dlcpd");
    server::DeclareDlcpdFlags(&c);
    absl::Status s = c.Load({"--dscp=46,34,18"}, Env({}));
    EXPECT_NE(s.message().find("--dscp"), std::string::npos) << s;
  }
  {
    ConfigRegistry c("dlcpd");
    server::DeclareDlcpdFlags(&c);
    ASSERT_TRUE(c.Load({"--plaintext", "--data-port=65535", "--data-threads=2"}, Env({})).ok());
    EXPECT_FALSE(server::DlcpdOptionsFromConfig(c).ok());
  }
}

}  // namespace
}  // namespace dlcp
