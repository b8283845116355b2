// The host stage's spare whole-tensor buffers: kept once let go, the smallest that holds an op
// taken, the largest kept, and given back from any thread, even after their SpareBuffers is gone.
#include "client/host/spare_buffers.h"

#include <thread>
#include <vector>

#include "common/base/sanitizers.h"
#include "gtest/gtest.h"

namespace dlcp {
namespace {

TEST(SpareBuffers, ABufferLetGoServesTheNextOpOfItsSize) {
  SpareBuffers spares(2);
  SpareBuffers::Buffer first = spares.Take(1000);
  ASSERT_NE(first, nullptr);
  first[999] = 1.5f;  // all of it is there
  float* const address = first.get();
  first.reset();
  EXPECT_EQ(spares.spare_bytes(), 1000 * sizeof(float));
  SpareBuffers::Buffer again = spares.Take(1000);
  EXPECT_EQ(again.get(), address);
  EXPECT_EQ(spares.spare_bytes(), 0u);
}

TEST(SpareBuffers, TakesTheSmallestThatHoldsAnOpAndKeepsTheLargest) {
  SpareBuffers spares(2);
  SpareBuffers::Buffer small = spares.Take(100);
  SpareBuffers::Buffer middle = spares.Take(200);
  SpareBuffers::Buffer large = spares.Take(300);
  float* const middle_address = middle.get();
  float* const large_address = large.get();
  small.reset();
  middle.reset();
  large.reset();
  EXPECT_EQ(spares.spare_bytes(), 500 * sizeof(float));  // the smallest went
  SpareBuffers::Buffer a = spares.Take(150);
  EXPECT_EQ(a.get(), middle_address);
  SpareBuffers::Buffer b = spares.Take(150);
  EXPECT_EQ(b.get(), large_address);
  SpareBuffers::Buffer c = spares.Take(150);  // none left: a new one
  ASSERT_NE(c, nullptr);
  EXPECT_NE(c.get(), middle_address);
  EXPECT_NE(c.get(), large_address);
}

TEST(SpareBuffers, ABufferOutlivesItsSpareBuffers) {
  SpareBuffers::Buffer kept;
  {
    SpareBuffers spares(1);
    kept = spares.Take(64);
    SpareBuffers::Buffer other = spares.Take(32);  // kept by the spares when they go
  }
  ASSERT_NE(kept, nullptr);
  kept[63] = 2;
  kept.reset();  // back to spares only it holds now, which free it (AddressSanitizer checks)
}

TEST(SpareBuffers, BuffersGoBackFromOtherThreads) {
  SpareBuffers spares(2);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&spares, t] {
      for (int i = 0; i < 500; ++i) {
        SpareBuffers::Buffer b = spares.Take(static_cast<uint64_t>(256 + 64 * ((t + i) % 4)));
        ASSERT_NE(b, nullptr);
        b[0] = static_cast<float>(i);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_GT(spares.spare_bytes(), 0u);
  EXPECT_LE(spares.spare_bytes(), 2 * 448 * sizeof(float));
}

#if defined(DLCP_UNDER_ASAN)
TEST(SpareBuffersDeathTest, AWriteIntoABufferLetGoIsReported) {
  SpareBuffers spares(1);
  SpareBuffers::Buffer b = spares.Take(16);
  float* const stale = b.get();
  b.reset();
  EXPECT_DEATH(*static_cast<volatile float*>(stale + 3) = 1.0f, "use-after-poison");
}
#endif

}  // namespace
}  // namespace dlcp
