// The settings tables in docs/configuration.md and docs/deploy.md come from the declarations (the client option table, dlcpd's
// registry), and every client option is reachable from every surface: the C settings string, the
// dlcp-bench flags (the Python keywords: tests/python/test_binding.py).
//
// A stale table fails here; `DLCP_UPDATE_DOCS=1 build/tests/settings_tables_test` rewrites it.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/capi/dlcp.h"
#include "client/options/client_option_table.h"
#include "common/config/registry.h"
#include "server/dlcpd/dlcpd_config.h"
#include "tests/common/text_files.h"

namespace dlcp {
namespace {

// Checks (or, with DLCP_UPDATE_DOCS=1, rewrites) the text between `<!-- NAME:begin -->` and
// `<!-- NAME:end -->` in `doc`.
void ExpectBlock(const std::string& doc, const std::string& name, const std::string& want) {
  const std::string path = absl::StrCat(DLCP_SOURCE_DIR, "/", doc);
  std::string text = testing::ReadFile(path);
  const std::string begin = absl::StrCat("<!-- ", name, ":begin -->\n");
  const std::string end = absl::StrCat("<!-- ", name, ":end -->");
  const size_t b = text.find(begin);
  const size_t e = text.find(end);
  ASSERT_NE(b, std::string::npos) << doc << " has no " << begin;
  ASSERT_NE(e, std::string::npos) << doc << " has no " << end;
  const size_t from = b + begin.size();
  if (text.substr(from, e - from) == want) return;
  if (const char* update = std::getenv("DLCP_UPDATE_DOCS"); update != nullptr && std::string(update) == "1") {
    text.replace(from, e - from, want);
    std::ofstream(path) << text;
    return;
  }
  ADD_FAILURE() << "the " << name << " table in " << doc
                << " is stale: run DLCP_UPDATE_DOCS=1 build/tests/settings_tables_test. It should read:\n"
                << want;
}

TEST(SettingsTables, ClientOptionsTableIsGenerated) {
  ExpectBlock("docs/configuration.md", "client-options", ClientOptionsMarkdown());
}

TEST(SettingsTables, DeployDlcpdSettingsAreGenerated) {
  ConfigRegistry c("dlcpd");
  server::DeclareDlcpdFlags(&c);
  ExpectBlock("docs/deploy.md", "dlcpd-settings", c.Markdown());
}

TEST(SettingsTables, EveryOptionHasHelpAndItsDefaultParses) {
  for (const ClientOption& o : ClientOptionTable()) {
    EXPECT_FALSE(o.help.empty()) << o.name;
    ClientOptions scratch;
    EXPECT_TRUE(o.set(o.default_text(), &scratch).ok()) << o.name << "=" << o.default_text();
  }
}

// Every option through the C settings string, each set to its default: the connect gets as far as
// dialling (UNAVAILABLE from a closed port, or DEADLINE_EXCEEDED where a loaded machine, under a
// sanitizer say, takes longer than rpc_timeout_ms to be refused), never INVALID_ARGUMENT.
TEST(SettingsTables, TheCSettingsStringTakesEveryOption) {
  for (const ClientOption& o : ClientOptionTable()) {
    if (o.name == "aggregators" || o.name == "job" || o.name == "world_size" || o.name == "rank") continue;
    const std::string value = o.name == "rpc_timeout_ms" ? "300" : o.default_text();
    if (value.find(',') != std::string::npos) continue;  // a list cannot ride a comma-separated string
    dlcp_options opts{};
    opts.size = sizeof(opts);
    opts.aggregators = "127.0.0.1:1";
    opts.job_name = "settings-surface";
    opts.world_size = 1;
    opts.plaintext = 1;
    const std::string settings = absl::StrCat(o.name, "=", value, ",rpc_timeout_ms=300");
    dlcp_client* client = nullptr;
    std::array<char, 512> err{};
    const int rc = dlcp_connect_with(&opts, settings.c_str(), &client, err.data(), err.size());
    EXPECT_TRUE(rc == static_cast<int>(absl::StatusCode::kUnavailable) ||
                rc == static_cast<int>(absl::StatusCode::kDeadlineExceeded))
        << "code " << rc << " for " << settings << ": " << err.data();
  }
}

TEST(SettingsTables, TheCSettingsStringNamesABadOne) {
  dlcp_options opts{};
  opts.size = sizeof(opts);
  opts.aggregators = "127.0.0.1:1";
  opts.job_name = "settings-surface";
  opts.world_size = 1;
  dlcp_client* client = nullptr;
  std::array<char, 512> err{};
  EXPECT_EQ(dlcp_connect_with(&opts, "window_bytes=12", &client, err.data(), err.size()), 3);
  EXPECT_STREQ(err.data(), "invalid value '12' for option window_bytes (dlcp_connect): must be in [64, 4294967296]");
  EXPECT_EQ(dlcp_connect_with(&opts, "no_such_option=1", &client, err.data(), err.size()), 3);
  EXPECT_NE(std::string(err.data()).find("unknown option 'no_such_option'"), std::string::npos) << err.data();
}

// Every option is a dlcp-bench flag, except the ones it sets itself, which its own flags stand for.
TEST(SettingsTables, DlcpBenchHasAFlagForEveryOption) {
  FILE* p = popen(absl::StrCat(DLCP_BENCH_PATH, " --help").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string help;
  std::array<char, 4096> buf;
  while (size_t n = fread(buf.data(), 1, buf.size(), p)) help.append(buf.data(), n);
  pclose(p);
  for (const ClientOption& o : ClientOptionTable()) {
    if (o.name == "world_size" || o.name == "compensation" || o.name == "error_feedback") continue;
    EXPECT_NE(help.find(absl::StrCat("  --", o.flag(), " (", o.env_name())), std::string::npos) << o.name;
  }
  EXPECT_NE(help.find("  --workers ("), std::string::npos);
}

}  // namespace
}  // namespace dlcp
