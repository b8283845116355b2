// dlcpctl doctor through the real binaries: host checks against sysfs and procfs trees the test
// lays out (an RDMA port up or down, none at all, small buffers), the locked-memory limit set
// with prlimit, probes of a live and an unreachable dlcpd, and of host stages through dlcpd's
// host socket: formed, refused for want of memory, and no dlcpd there. tests/rdma-vm/guest.sh runs
// it on a real Soft-RoCE device too.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/host/stage_join.h"
#include "common/base/clock.h"
#include "tests/integration/process_harness.h"

namespace dlcp::testing {
namespace {

namespace fs = std::filesystem;

void Write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text << "\n";
}

class DoctorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dlcp-doctor.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    Write(root_ / "proc/sys/net/core/rmem_max", "67108864");
    Write(root_ / "proc/sys/net/core/wmem_max", "212992");
  }
  void TearDown() override { fs::remove_all(root_); }

  // A RoCE port: GID 0 RoCE v1, GID 1 RoCE v2 on 10.1.2.3 over eth9, whose MTU is `mtu`.
  void AddRocePort(const std::string& state, int mtu) {
    const fs::path port = root_ / "sys/class/infiniband/rxe0/ports/1";
    Write(port / "state", state);
    Write(port / "link_layer", "Ethernet");
    Write(port / "gid_attrs/types/0", "IB/RoCE v1");
    Write(port / "gids/0", "fe80:0000:0000:0000:0000:0000:0000:0001");
    Write(port / "gid_attrs/types/1", "RoCE v2");
    Write(port / "gids/1", "0000:0000:0000:0000:0000:ffff:0a01:0203");
    Write(port / "gid_attrs/ndevs/1", "eth9");
    Write(root_ / "sys/class/net/eth9/mtu", std::to_string(mtu));
  }

  // dlcpctl doctor, under a locked-memory limit of `memlock` bytes if given (prlimit can only lower
  // it here), for a dlcpd of 64 receive slots: about 4.5 MiB of registered buffers.
  ProcessResult Doctor(const std::vector<std::string>& aggregators, const std::string& memlock = "",
                       const std::string& host_socket = "") {
    std::string aggs = "--aggregators=";
    for (size_t i = 0; i < aggregators.size(); ++i) aggs += (i ? "," : "") + aggregators[i];
    std::vector<std::string> argv{DLCPCTL_PATH, "doctor", "--plaintext", "--transport=udp", "--timeout-ms=3000",
                                  "--rdma-recv-slots=64", aggs, "--sysfs-root=" + (root_ / "sys").string(),
                                  "--procfs-root=" + (root_ / "proc").string(), "--host-socket=" + host_socket};
    if (!memlock.empty()) argv.insert(argv.begin(), {"/usr/bin/prlimit", "--memlock=" + memlock + ":" + memlock});
    return RunProcess(argv, absl::Seconds(30));
  }

  fs::path root_;
};

TEST_F(DoctorTest, AHealthyHostAndAggregatorAreOkAndTheFixesAreNamed) {
  auto d = Daemon::Start(DLCPD_PATH, {});
  ASSERT_NE(d, nullptr);
  AddRocePort("4: ACTIVE", 9000);
  ProcessResult r = Doctor({d->control()});
  // Whether this machine's own locked-memory limit holds the 4.5 MiB decides the one line.
  rlimit lim{};
  getrlimit(RLIMIT_MEMLOCK, &lim);
  const bool enough = lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur >= (64 + 1024) * (4096 + 128);
  EXPECT_EQ(r.exit_code, enough ? 0 : 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, enough ? "ok    memlock: limit" : "FAIL  memlock: limit")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "ok    rdma port rxe0/1: state 4: ACTIVE, link layer Ethernet")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "dlcp would use index 1 (RoCE v2, 10.1.2.3 on eth9)")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "ok    mtu eth9: interface MTU 9000 gives RoCE an active MTU of 4096")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "ok    net.core.rmem_max: 67108864 bytes")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "warn  net.core.wmem_max: 212992 bytes caps")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "sysctl -w net.core.wmem_max=67108864")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, absl::StrCat("ok    aggregator ", d->control(), ": control (Join)"))) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "data round trip over UDP")) << r.out;
  EXPECT_EQ(d->Stop(absl::Seconds(5)), 0);
}

TEST_F(DoctorTest, LowMemlockASmallMtuAndAPortDownAreCalledOut) {
  AddRocePort("4: ACTIVE", 1500);
  ProcessResult low = Doctor({}, "65536");
  EXPECT_EQ(low.exit_code, 1) << low.out;
  EXPECT_TRUE(absl::StrContains(low.out, "FAIL  memlock: limit 64 KiB, but dlcpd over RDMA registers about")) << low.out;
  EXPECT_TRUE(absl::StrContains(low.out, "ulimit -l unlimited")) << low.out;
  EXPECT_TRUE(absl::StrContains(low.out, "warn  mtu eth9: interface MTU 1500 gives RoCE an active MTU of 1024")) << low.out;

  AddRocePort("1: DOWN", 9000);
  ProcessResult down = Doctor({});
  EXPECT_EQ(down.exit_code, 1) << down.out;
  EXPECT_TRUE(absl::StrContains(down.out, "FAIL  rdma port rxe0/1: state 1: DOWN: bring its network interface up"))
      << down.out;
}

TEST_F(DoctorTest, NoDeviceWarnsAndAnUnreachableAggregatorFails) {
  ProcessResult r = Doctor({"127.0.0.1:1"}, "65536");
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "warn  rdma: no RDMA device: dlcp runs over UDP")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "ok    memlock: limit 64 KiB, not needed without RDMA")) << r.out;
  EXPECT_TRUE(absl::StrContains(r.out, "FAIL  aggregator 127.0.0.1:1: control (Join): UNAVAILABLE")) << r.out;
}

TEST_F(DoctorTest, AHostStageFormsThroughDlcpdsSocketOrTheReasonAndTheFixAreNamed) {
  // Room for one stage of two at a time: 2 + kStageBanks slots of 192 KiB and the header, in 3 MiB.
  auto d = Daemon::Start(DLCPD_PATH, {"--host-slot-bytes=196608", "--host-shm-bytes=3145728"});
  ASSERT_NE(d, nullptr);
  ProcessResult formed = Doctor({}, "65536", d->host_socket());
  EXPECT_EQ(formed.exit_code, 0) << formed.out;
  EXPECT_TRUE(absl::StrContains(formed.out, absl::StrCat("ok    host stage ", d->host_socket(),
                                                         ": dlcpd formed a stage of 2 workers")))
      << formed.out;
  EXPECT_TRUE(absl::StrContains(formed.out, "slots of 0.2 MiB), one memory in both")) << formed.out;

  // A job's stage holds the memory; the doctor's is refused, naming the setting.
  StageJoinOptions join;
  join.socket_path = d->host_socket();
  join.hello = {"holder", 2, 0, 2, false};
  absl::StatusOr<OwnedFd> first = RequestHostStage(join);
  ASSERT_TRUE(first.ok()) << first.status();
  join.hello.rank = 1;
  absl::StatusOr<StageMembership> second = JoinHostStage(join);
  ASSERT_TRUE(second.ok()) << second.status();
  ProcessResult full = Doctor({}, "65536", d->host_socket());
  EXPECT_EQ(full.exit_code, 0) << full.out;  // a warning: the job would run, its workers pushing their own
  EXPECT_TRUE(absl::StrContains(full.out, absl::StrCat("warn  host stage ", d->host_socket(), ": no host stage: "))) << full.out;
  EXPECT_TRUE(absl::StrContains(full.out, "of dlcpd --host-shm-bytes=3145728")) << full.out;
  EXPECT_TRUE(absl::StrContains(full.out, "would each push their own data")) << full.out;

  const std::string none = (root_ / "none.sock").string();
  ProcessResult absent = Doctor({}, "65536", none);
  EXPECT_TRUE(absl::StrContains(absent.out, absl::StrCat("warn  host stage ", none, ": no host stage: no dlcpd serves")))
      << absent.out;
  EXPECT_TRUE(absl::StrContains(absent.out, "the node's /run/dlcp")) << absent.out;
  EXPECT_FALSE(absl::StrContains(Doctor({}, "65536", "").out, "host stage")) << "an empty --host-socket is not checked";
  EXPECT_EQ(d->Stop(absl::Seconds(5)), 0);
}

}  // namespace
}  // namespace dlcp::testing
