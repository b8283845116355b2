// ReadPortCounters against a sysfs tree laid out as the kernel exports an RDMA port's
// hw_counters (mlx5's names), in a temporary directory. tests/rdma-vm reads Soft-RoCE's real ones.
#include "common/transport/rdma/port_counters.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace dlcp {
namespace {

class PortCountersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = std::filesystem::path(::testing::TempDir()) /
            ("sysfs-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    std::filesystem::remove_all(root_);
    dir_ = root_ / "class/infiniband/mlx5_1/ports/1/hw_counters";
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void Write(const std::string& name, const std::string& text) { std::ofstream(dir_ / name) << text; }

  std::filesystem::path root_, dir_;
};

TEST_F(PortCountersTest, ReadsEveryCounterSortedAndLeavesOutTheCachePeriod) {
  Write("rx_write_requests", "0\n");
  Write("out_of_buffer", "18446744073709551615\n");  // the largest a u64 counter can hold
  Write("lifespan", "10\n");
  Write("duplicate_request", "42\n");
  absl::StatusOr<std::vector<PortCounter>> c = ReadPortCounters(root_.string(), "mlx5_1", 1);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->size(), 3u);
  EXPECT_EQ((*c)[0].name, "duplicate_request");
  EXPECT_EQ((*c)[0].value, 42u);
  EXPECT_EQ((*c)[1].name, "out_of_buffer");
  EXPECT_EQ((*c)[1].value, UINT64_MAX);
  EXPECT_EQ((*c)[2].name, "rx_write_requests");
  EXPECT_EQ((*c)[2].value, 0u);

  Write("out_of_buffer", "7\n");  // read anew every time
  absl::StatusOr<uint64_t> one = ReadPortCounter(root_.string(), "mlx5_1", 1, "out_of_buffer");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(*one, 7u);
}

TEST_F(PortCountersTest, AMissingPortOrCounterIsNotFoundAndNamesThePath) {
  absl::StatusOr<std::vector<PortCounter>> c = ReadPortCounters(root_.string(), "mlx5_1", 2);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("mlx5_1/ports/2/hw_counters"), std::string::npos) << c.status();
  // A port that exports the directory but no counter in it.
  c = ReadPortCounters(root_.string(), "mlx5_1", 1);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("no counters"), std::string::npos) << c.status();
  absl::StatusOr<uint64_t> one = ReadPortCounter(root_.string(), "mlx5_1", 1, "out_of_buffer");
  EXPECT_EQ(one.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(one.status().message().find("hw_counters/out_of_buffer"), std::string::npos) << one.status();
}

TEST_F(PortCountersTest, RefusesWhatIsNotACountAndNamesThatAreNotCounters) {
  Write("out_of_buffer", "-3\n");
  absl::StatusOr<std::vector<PortCounter>> c = ReadPortCounters(root_.string(), "mlx5_1", 1);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(c.status().message().find("out_of_buffer holds '-3'"), std::string::npos) << c.status();
  Write("out_of_buffer", "\n");
  EXPECT_EQ(ReadPortCounter(root_.string(), "mlx5_1", 1, "out_of_buffer").status().code(),
            absl::StatusCode::kDataLoss);
  for (const char* name : {"", ".", "..", "../../1/hw_counters/out_of_buffer"}) {
    EXPECT_EQ(ReadPortCounter(root_.string(), "mlx5_1", 1, name).status().code(),
              absl::StatusCode::kInvalidArgument)
        << name;
  }
}

}  // namespace
}  // namespace dlcp
