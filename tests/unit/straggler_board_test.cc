#include "common/metrics/straggler_board.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace dlcp {
namespace {

constexpr int64_t kSecond = 1'000'000'000;

TEST(StragglerBoard, RanksTheLatestFirstWithItsQuantilesAndTimesLast) {
  StragglerBoard board(3);
  // Rank 1 delivers 10 ms after rank 0 in 90 rounds and 100 ms after in 10; rank 2 with rank 0.
  for (int i = 0; i < 100; ++i) board.NoteRound({1000, i < 90 ? 11000u : 101000u, 1000});
  std::vector<RankLateness> ranks = board.Ranks(kSecond);
  ASSERT_EQ(ranks.size(), 3u);
  EXPECT_EQ(ranks[0].rank, 1u);
  EXPECT_EQ(ranks[0].rounds, 100u);
  EXPECT_EQ(ranks[0].p50_us, 10000u);
  EXPECT_EQ(ranks[0].p99_us, 100000u);
  EXPECT_EQ(ranks[0].mean_us, 19000u);
  EXPECT_EQ(ranks[0].last, 100u);
  EXPECT_EQ(ranks[1].mean_us, 0u);
  EXPECT_EQ(ranks[1].last, 0u);  // ties with the first name nobody last
  // A heartbeat takes the slowest alone.
  std::vector<RankLateness> first = board.Ranks(kSecond, 1);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].rank, 1u);
  EXPECT_EQ(first[0].mean_us, 19000u);
}

TEST(StragglerBoard, ARankThatNeverDeliveredCountsAsLastAndTheWindowSlides) {
  StragglerBoard board(2);
  for (uint32_t i = 0; i < StragglerBoard::kWindow; ++i) board.NoteRound({500, 0});  // rank 1 sealed out
  EXPECT_EQ(board.Ranks(kSecond)[0].last, StragglerBoard::kWindow);
  // A window of rounds later rank 0 is the late one, and nothing of before is left.
  for (uint32_t i = 0; i < StragglerBoard::kWindow; ++i) board.NoteRound({3000, 1000});
  EXPECT_EQ(board.Ranks(kSecond)[0].rank, 1u) << "summed up again within the second";
  std::vector<RankLateness> ranks = board.Ranks(3 * kSecond);
  EXPECT_EQ(ranks[0].rank, 0u);
  EXPECT_EQ(ranks[0].p50_us, 2000u);
  EXPECT_EQ(ranks[0].last, StragglerBoard::kWindow);
  EXPECT_EQ(ranks[1].last, 0u);
}

TEST(StragglerBoard, CountsDropsAndRepairsAndIgnoresWhatDoesNotFit) {
  StragglerBoard board(2);
  EXPECT_TRUE(board.Ranks(kSecond).empty());
  board.NoteRound({100});       // the wrong world: ignored
  board.NoteRound({0, 0});      // nobody delivered: ignored
  board.NoteNacked(1, 7);
  board.NoteNacked(5, 7);       // no such rank: ignored
  board.NoteRepaired(1);
  board.NoteRound({100, 100});
  std::vector<RankLateness> ranks = board.Ranks(3 * kSecond);
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_EQ(ranks[0].rounds, 1u);
  const RankLateness& one = ranks[0].rank == 1 ? ranks[0] : ranks[1];
  EXPECT_EQ(one.nacked, 7u);
  EXPECT_EQ(one.repaired, 1u);
}

// Data threads note rounds while control threads read (a heartbeat, a scrape): under TSan too.
TEST(StragglerBoard, DataThreadsNoteWhileControlThreadsRead) {
  StragglerBoard board(4);
  std::atomic<bool> done{false};
  std::vector<std::thread> noters;
  for (int t = 0; t < 3; ++t) {
    noters.emplace_back([&board] {
      for (int i = 0; i < 2000; ++i) {
        board.NoteRound({100, 100, 5100, 100});  // rank 2 is 5 ms late every time
        board.NoteNacked(2, 1);
      }
    });
  }
  std::thread reader([&] {
    for (int64_t now = kSecond; !done.load(); now += kSecond) board.Ranks(now);
  });
  for (auto& t : noters) t.join();
  done = true;
  reader.join();
  std::vector<RankLateness> ranks = board.Ranks(int64_t{1} << 62);
  ASSERT_EQ(ranks.size(), 4u);
  EXPECT_EQ(ranks[0].rank, 2u);
  EXPECT_EQ(ranks[0].mean_us, 5000u);
  EXPECT_EQ(ranks[0].nacked, 6000u);
}

// A stage that holds the whole job: no round reaches an aggregator, and the stage's own view is
// the job's. A stale report goes.
TEST(StragglerBoard, AWholeJobStagesViewIsTheJobsUntilItGoesStale) {
  StragglerBoard board(3);
  EXPECT_TRUE(board.Ranks(kSecond).empty());
  board.NoteStage(0, {{.rank = 0, .rounds = 9, .mean_us = 0}, {.rank = 1, .rounds = 9, .mean_us = 40000, .last = 9},
                      {.rank = 2, .rounds = 9, .mean_us = 100}, {.rank = 7, .mean_us = 99999}},  // 7: not of the job
                  kSecond);
  std::vector<RankLateness> ranks = board.Ranks(2 * kSecond);
  ASSERT_EQ(ranks.size(), 3u);
  EXPECT_EQ(ranks[0].rank, 1u);
  EXPECT_EQ(ranks[0].mean_us, 40000u);
  EXPECT_EQ(ranks[0].last, 9u);
  EXPECT_TRUE(board.Ranks(2 * kSecond + StragglerBoard::kStageReportNs).empty());
}

// Two stages of two: the aggregator sees each stage's push for both of its ranks at once, 30 ms
// apart. Within the late stage, rank 2 came 30 ms after rank 3: rank 2 is the late one, and
// rank 3 is as early as the other stage.
TEST(StragglerBoard, AStagesViewNamesWhichOfItsRanksHeldItsPushUp) {
  StragglerBoard board(4);
  for (uint32_t i = 0; i < 10; ++i) board.NoteRound({100, 100, 30100, 30100});
  board.NoteStage(2, {{.rank = 2, .rounds = 10, .mean_us = 30000, .last = 10, .ahead_us = 0},
                      {.rank = 3, .rounds = 10, .mean_us = 0, .last = 0, .ahead_us = 30000}},
                  kSecond);
  std::vector<RankLateness> ranks = board.Ranks(kSecond);
  ASSERT_EQ(ranks.size(), 4u);
  EXPECT_EQ(ranks[0].rank, 2u);
  EXPECT_EQ(ranks[0].mean_us, 30000u);
  EXPECT_EQ(ranks[0].last, 10u);
  for (size_t i = 1; i < 4; ++i) {
    EXPECT_EQ(ranks[i].mean_us, 0u) << ranks[i].rank;
    EXPECT_EQ(ranks[i].last, 0u) << ranks[i].rank;
  }
}

}  // namespace
}  // namespace dlcp
