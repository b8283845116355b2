#include "common/datapath/nack_filter.h"

#include <gtest/gtest.h>

namespace dlcp {
namespace {

TEST(NackFilterTest, NothingIsKnownLostBeforeAnyResult) {
  NackFilter f(4);
  for (uint32_t path = 0; path < 4; ++path) {
    for (uint8_t cls = 0; cls < wire::kNumClasses; ++cls) EXPECT_FALSE(f.KnownLost(path, cls, 1));
  }
}

TEST(NackFilterTest, ALaterPushAnsweredOnTheSamePathAndClassProvesTheLoss) {
  NackFilter f(4);
  f.OnDelivered(2, 3, 100);
  EXPECT_TRUE(f.KnownLost(2, 3, 99));
  EXPECT_TRUE(f.KnownLost(2, 3, 1));
  // Not pushed before the one answered: it may come yet.
  EXPECT_FALSE(f.KnownLost(2, 3, 100));
  EXPECT_FALSE(f.KnownLost(2, 3, 101));
}

TEST(NackFilterTest, OtherPathsAndClassesProveNothing) {
  NackFilter f(4);
  f.OnDelivered(2, 1, 100);
  // Another path: another queue, of another delay. A more important class: served first by
  // strict priority, so it overtakes the less important one without any loss.
  EXPECT_FALSE(f.KnownLost(1, 1, 50));
  EXPECT_FALSE(f.KnownLost(2, 3, 50));
  EXPECT_FALSE(f.KnownLost(2, 0, 50));
}

TEST(NackFilterTest, TheNewestAnswerCountsWhateverOrderResultsComeIn) {
  NackFilter f(1);
  f.OnDelivered(0, 2, 80);
  f.OnDelivered(0, 2, 40);  // a late result for an earlier push does not move the mark back
  EXPECT_TRUE(f.KnownLost(0, 2, 79));
}

TEST(NackFilterTest, PathsBeyondTheCountShareTheFirstsMark) {
  NackFilter f(1);  // no steering: the path a push took is unknown, so every push counts as path 0
  f.OnDelivered(7, 0, 10);
  EXPECT_TRUE(f.KnownLost(0, 0, 9));
  EXPECT_TRUE(f.KnownLost(5, 0, 9));
}

TEST(NackFilterTest, AnUnknownClassIsNeverKnownLost) {
  NackFilter f(1);
  f.OnDelivered(0, wire::kNumClasses, 10);  // ignored
  EXPECT_FALSE(f.KnownLost(0, wire::kNumClasses, 1));
  for (uint8_t cls = 0; cls < wire::kNumClasses; ++cls) EXPECT_FALSE(f.KnownLost(0, cls, 1));
}

}  // namespace
}  // namespace dlcp
