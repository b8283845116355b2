#include "common/base/clock.h"
#include "server/jobs/regroup_barrier.h"

#include <gtest/gtest.h>

namespace dlcp::server {
namespace {

struct Box {
  std::optional<absl::StatusOr<RegroupOutcome>> got;
  RegroupBarrier::Reply reply() {
    return [this](absl::StatusOr<RegroupOutcome> r) { got = std::move(r); };
  }
};

RegroupArrival Arrival(uint32_t rank, uint32_t generation, bool coordinate,
                       std::vector<std::pair<uint32_t, uint32_t>> done = {}, std::vector<std::string> lost = {"b:1"}) {
  RegroupArrival a;
  a.rank = rank;
  a.generation = generation;
  a.lost = std::move(lost);
  a.coordinate = coordinate;
  a.done = std::move(done);
  a.deadline = MonotonicNow() + absl::Seconds(10);
  return a;
}

TEST(RegroupBarrier, CoordinatorAnswersEveryoneOnceAllArriveWithEachKeysSpan) {
  RegroupBarrier b(3);
  int epochs = 0;
  auto next = [&] { return static_cast<uint32_t>(100 + ++epochs); };
  Box w0, w1, w2, plain;
  EXPECT_FALSE(b.Arrive(Arrival(0, 1, true, {{7, 5}, {8, 1}}), next, w0.reply()));
  EXPECT_FALSE(b.Arrive(Arrival(2, 1, false), next, plain.reply()));
  ASSERT_TRUE(plain.got.has_value());  // a plain arrival does not wait
  EXPECT_EQ((*plain.got)->epoch, 101u);
  EXPECT_FALSE(b.Arrive(Arrival(1, 1, true, {{7, 4}}), next, w1.reply()));
  EXPECT_FALSE(w0.got.has_value());
  EXPECT_FALSE(b.Arrive(Arrival(2, 1, true, {{7, 5}, {8, 1}}), next, w2.reply()));
  for (Box* w : {&w0, &w1, &w2}) {
    ASSERT_TRUE(w->got.has_value());
    ASSERT_TRUE(w->got->ok()) << w->got->status();
    EXPECT_EQ((*w->got)->epoch, 101u);  // one new epoch per generation
    // Key 8: rank 1 never used it, so it has finished none of its rounds.
    EXPECT_EQ((*w->got)->spans, (std::vector<KeySpan>{{7, 4, 5}, {8, 0, 1}}));
  }
  EXPECT_EQ(epochs, 1);
  // A late repeat of the generation gets the same answer; an older one is refused.
  Box again, old;
  EXPECT_FALSE(b.Arrive(Arrival(1, 1, true, {{7, 4}}), next, again.reply()));
  EXPECT_EQ((*again.got)->spans, (*w0.got)->spans);
  EXPECT_FALSE(b.Arrive(Arrival(1, 0, false), next, old.reply()));
  EXPECT_EQ(old.got->status().code(), absl::StatusCode::kFailedPrecondition);
  // The next generation starts afresh with another epoch.
  Box next_gen;
  EXPECT_FALSE(b.Arrive(Arrival(0, 2, false, {}, {"b:1", "c:1"}), next, next_gen.reply()));
  EXPECT_EQ((*next_gen.got)->epoch, 102u);
}

TEST(RegroupBarrier, WorkersThatDisagreeFailTheRegroup) {
  RegroupBarrier b(2);
  auto next = [] { return 5u; };
  Box w0, w1;
  EXPECT_FALSE(b.Arrive(Arrival(0, 1, true), next, w0.reply()));
  std::optional<std::string> why = b.Arrive(Arrival(1, 1, true, {}, {"c:1"}), next, w1.reply());
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("disagree"), std::string::npos) << *why;
  EXPECT_EQ(w0.got->status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(w1.got->status().code(), absl::StatusCode::kAborted);

  RegroupBarrier far(2);
  Box f0, f1;
  EXPECT_FALSE(far.Arrive(Arrival(0, 1, true, {{1, 3}}), next, f0.reply()));
  why = far.Arrive(Arrival(1, 1, true, {{1, 5}}), next, f1.reply());
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("key 1"), std::string::npos) << *why;
  EXPECT_EQ(f0.got->status().code(), absl::StatusCode::kAborted);
}

TEST(RegroupBarrier, ExpiryNamesTheRanksThatNeverCame) {
  RegroupBarrier b(3);
  auto next = [] { return 5u; };
  Box w1;
  RegroupArrival a = Arrival(1, 1, true);
  a.deadline = MonotonicNow() + absl::Milliseconds(50);
  EXPECT_FALSE(b.Arrive(a, next, w1.reply()));
  EXPECT_FALSE(b.Expire(MonotonicNow()).has_value());
  EXPECT_FALSE(w1.got.has_value());
  std::optional<std::string> why = b.Expire(MonotonicNow() + absl::Seconds(1));
  ASSERT_TRUE(why.has_value());
  EXPECT_NE(why->find("ranks 0, 2"), std::string::npos) << *why;
  EXPECT_EQ(w1.got->status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(RegroupBarrier, AnEndingJobAnswersWhoeverWaits) {
  Box w0;
  {
    RegroupBarrier b(2);
    EXPECT_FALSE(b.Arrive(Arrival(0, 1, true), [] { return 5u; }, w0.reply()));
    EXPECT_FALSE(w0.got.has_value());
  }
  ASSERT_TRUE(w0.got.has_value());
  EXPECT_EQ(w0.got->status().code(), absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace dlcp::server
