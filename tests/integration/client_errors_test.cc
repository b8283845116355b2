// Bad calls and unreachable peers give clear errors within their deadlines; nothing hangs.
#include <gtest/gtest.h>

#include <grpcpp/grpcpp.h>

#include <unistd.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/base/clock.h"
#include "common/wire/header.h"
#include "dlcp/v1/control.grpc.pb.h"
#include "tests/integration/client_test_util.h"
#include "tests/integration/test_aggregator.h"
#include "common/transport/transport_options.h"

namespace dlcp::testing {
namespace {

TEST(ClientErrors, UnreachableAggregatorFailsWithinTheRpcDeadline) {
  ClientOptions o = Opts("127.0.0.1:1", "j");  // nothing listens on port 1
  absl::Time start = MonotonicNow();
  auto c = Client::Connect(o);
  EXPECT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_NE(c.status().message().find("127.0.0.1:1"), std::string::npos) << c.status();
  EXPECT_LT(MonotonicNow() - start, absl::Seconds(5));
}

TEST(ClientErrors, InvalidOptionsAreRefusedBeforeAnyCall) {
  ClientOptions o = Opts("127.0.0.1:1", "j", 2, 2);
  EXPECT_EQ(Client::Connect(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Opts("127.0.0.1:1", "j");
  o.chunk_bytes = 1001;
  EXPECT_EQ(Client::Connect(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = Opts("127.0.0.1:1", "j");
  o.aggregators.clear();
  EXPECT_EQ(Client::Connect(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ClientErrors, BadAllReduceCalls) {
  auto agg = TestAggregator::Start({});
  ASSERT_NE(agg, nullptr);
  auto c = Client::Connect(Opts(agg->address(), "bad-calls", 2, 0));
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<float> a(100, 1), b(100, 1);
  EXPECT_EQ((*c)->AllReduce(1, {}).get().status().code(), absl::StatusCode::kInvalidArgument);
  auto first = (*c)->AllReduce(1, absl::MakeSpan(a));  // rank 1 never comes: stays pending
  auto second = (*c)->AllReduce(1, absl::MakeSpan(b));
  EXPECT_EQ(second.get().status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*c)->Close().ok());
  EXPECT_EQ(first.get().status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ((*c)->AllReduce(2, absl::MakeSpan(a)).get().status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ClientErrors, DeviceTensorWithoutAUsableDeviceIsRefusedSayingWhy) {
  if (CudaPackerAvailable().ok()) GTEST_SKIP() << "a CUDA device is present; dlcp_cuda_tests covers device tensors";
  auto agg = TestAggregator::Start({});
  ASSERT_NE(agg, nullptr);
  auto c = Client::Connect(Opts(agg->address(), "no-device", 1, 0));
  ASSERT_TRUE(c.ok()) << c.status();
  float fake = 0;  // never read: the op is refused first
  auto r = (*c)->AllReduceDevice(1, DeviceTensor{&fake, ElemType::kF32, 1, 0}).get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(r.status().message().find(std::string(CudaPackerAvailable().message())), std::string::npos) << r.status();
  // The client goes on with host tensors.
  std::vector<float> a(100, 2);
  ASSERT_TRUE((*c)->AllReduce(1, absl::MakeSpan(a)).get().ok());
  EXPECT_EQ(a[99], 2);
}

// Workers that disagree on a key's encoding cannot be summed: the aggregator refuses the pushes
// in the encoding its round did not start with, and the ops fail at their deadline.
TEST(ClientErrors, WorkersDisagreeingOnTheEncodingAreRefused) {
  auto agg = TestAggregator::Start({});
  ASSERT_NE(agg, nullptr);
  std::vector<std::unique_ptr<Client>> clients(2);
  std::vector<std::thread> joiners;
  for (uint32_t r = 0; r < 2; ++r) {
    joiners.emplace_back([&, r] {
      ClientOptions o = Opts(agg->address(), "encodings", 2, r);
      o.op_timeout = absl::Milliseconds(600);
      o.payload_encoding = r == 0 ? wire::Encoding::kF32 : wire::Encoding::kBF16;
      auto c = Client::Connect(o);
      if (c.ok()) clients[r] = std::move(*c);
    });
  }
  for (auto& j : joiners) j.join();
  ASSERT_TRUE(clients[0] && clients[1]);
  std::vector<float> a(3000, 1), b(3000, 1);
  auto f0 = clients[0]->AllReduce(4, absl::MakeSpan(a));
  auto f1 = clients[1]->AllReduce(4, absl::MakeSpan(b));
  EXPECT_EQ(f0.get().status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(f1.get().status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_GT(agg->Counter("dlcp_rejects_total{reason=\"shape_mismatch\"}"), 0);
}

TEST(ClientErrors, MissingPeerMeansDeadlineExceededNamingTheShortfall) {
  auto agg = TestAggregator::Start({});
  ASSERT_NE(agg, nullptr);
  ClientOptions o = Opts(agg->address(), "lonely", 2, 0);
  o.op_timeout = absl::Milliseconds(500);
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<float> a(5000, 1);
  absl::Time start = MonotonicNow();
  auto r = (*c)->AllReduce(7, absl::MakeSpan(a)).get();
  absl::Duration took = MonotonicNow() - start;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_NE(r.status().message().find("result chunks missing"), std::string::npos) << r.status();
  EXPECT_GE(took, absl::Milliseconds(450));
  EXPECT_LT(took, absl::Seconds(3));
}

// A timeout names the ranks that have not contributed, which the aggregators know: rank 1 of
// three joined but never all-reduces key 9, while ranks 0 and 2 wait on it past their deadline.
TEST(ClientErrors, AnOpDeadlineNamesTheRanksThatGaveNothing) {
  auto agg = TestAggregator::Start({});
  ASSERT_NE(agg, nullptr);
  std::vector<std::unique_ptr<Client>> clients(3);
  std::vector<std::thread> joins;
  for (uint32_t r = 0; r < 3; ++r) {
    joins.emplace_back([&, r] {
      ClientOptions o = Opts(agg->address(), "silent-rank", 3, r);
      o.op_timeout = absl::Seconds(3);  // the aggregator notes a round once it has waited a second
      o.heartbeat_interval = absl::Milliseconds(200);
      if (auto c = Client::Connect(o); c.ok()) clients[r] = std::move(*c);
    });
  }
  for (auto& j : joins) j.join();
  for (const auto& c : clients) ASSERT_NE(c, nullptr);
  std::vector<float> a(5000, 1), b(5000, 2);
  auto f0 = clients[0]->AllReduce(9, absl::MakeSpan(a));
  auto f2 = clients[2]->AllReduce(9, absl::MakeSpan(b));
  for (auto* f : {&f0, &f2}) {
    absl::StatusOr<RoundStats> r = f->get();
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
    EXPECT_NE(r.status().message().find(absl::StrCat("Aggregator ", agg->address(),
                                                     "'s round 0 of key 9 had nothing from rank 1 after ")),
              std::string::npos)
        << r.status();
  }
}

TEST(ClientErrors, JoinConflictsAreRefused) {
  auto agg = TestAggregator::Start({});
  ASSERT_NE(agg, nullptr);
  auto c0 = Client::Connect(Opts(agg->address(), "shape", 2, 0));
  ASSERT_TRUE(c0.ok()) << c0.status();
  ClientOptions other = Opts(agg->address(), "shape", 2, 1);
  other.chunk_bytes = 2048;
  auto c1 = Client::Connect(other);
  EXPECT_EQ(c1.status().code(), absl::StatusCode::kFailedPrecondition) << c1.status();
  EXPECT_NE(c1.status().message().find("chunk_bytes"), std::string::npos);
  auto c2 = Client::Connect(Opts(agg->address(), "shape", 3, 1));
  EXPECT_EQ(c2.status().code(), absl::StatusCode::kFailedPrecondition) << c2.status();
}

// A second process given a rank a live worker holds is refused at once, naming the holder, and
// the holder's job goes on exactly. A Join after the holder's heartbeats lapsed is a restart:
// it is taken, and the displaced holder's next heartbeat is told who took its rank.
TEST(ClientErrors, ASecondWorkerGivenALiveRankIsRefusedNamingTheHolder) {
  TestAggregatorOptions ao;
  ao.limits.heartbeat_timeout = absl::Milliseconds(600);
  auto agg = TestAggregator::Start(ao);
  ASSERT_NE(agg, nullptr);
  std::vector<std::unique_ptr<Client>> clients = ConnectAll(agg->address(), "duplicate", 2);
  ASSERT_NE(clients[0], nullptr);
  ASSERT_NE(clients[1], nullptr);
  auto dup = Client::Connect(Opts(agg->address(), "duplicate", 2, 1));
  ASSERT_EQ(dup.status().code(), absl::StatusCode::kFailedPrecondition) << dup.status();
  const std::string holder = absl::StrCat(" pid ", ::getpid(), ";");
  EXPECT_NE(dup.status().message().find("job 'duplicate': rank 1 is held by a live worker (host "), std::string::npos)
      << dup.status();
  EXPECT_NE(dup.status().message().find(holder), std::string::npos) << dup.status();
  EXPECT_EQ(TwoWorkerRound(clients, 1, 2), std::make_pair(3.0f, 3.0f));

  // A holder that went silent (a hand-made Join, which never beats) gives its rank up once its
  // heartbeats lapse.
  auto stub = v1::Aggregator::NewStub(grpc::CreateChannel(agg->address(), grpc::InsecureChannelCredentials()));
  std::unique_ptr<Transport> socket = TestSocket();
  ASSERT_NE(socket, nullptr);
  v1::JoinRequest req = TestAggregator::HandJoin("restart", 1, 0, socket->local_address().port);
  req.set_incarnation(42);
  req.set_client_host("old-node");
  req.set_client_pid(7);
  v1::JoinResponse joined;
  ASSERT_TRUE(agg->Join(req, &joined).ok());
  auto early = Client::Connect(Opts(agg->address(), "restart", 1, 0));
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition) << early.status();
  EXPECT_NE(early.status().message().find("(host old-node pid 7;"), std::string::npos) << early.status();
  absl::StatusOr<std::unique_ptr<Client>> restarted = absl::UnknownError("not tried");
  for (const absl::Time end = MonotonicNow() + absl::Seconds(10); !restarted.ok() && MonotonicNow() < end;) {
    absl::SleepFor(absl::Milliseconds(100));  // until the holder's 600 ms heartbeat deadline has passed
    restarted = Client::Connect(Opts(agg->address(), "restart", 1, 0));
  }
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  std::vector<float> d(1000, 4.0f);
  ASSERT_TRUE((*restarted)->AllReduce(0, absl::MakeSpan(d)).get().ok());
  EXPECT_EQ(d, std::vector<float>(1000, 4.0f));
  v1::HeartbeatRequest hb;
  hb.set_job_id(joined.job_id());
  hb.set_rank(0);
  hb.set_incarnation(42);
  v1::HeartbeatResponse beat;
  grpc::ClientContext hb_ctx;
  hb_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Status st = stub->Heartbeat(&hb_ctx, hb, &beat);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_NE(st.error_message().find("job 'restart': rank 0 is now held by another worker (host "), std::string::npos)
      << st.error_message();
}

// Workers given other aggregators than the rest of their job (DNS during a rollout, say) are
// refused at their first Join, saying what differs, not left to run into the op deadline.
TEST(ClientErrors, WorkersGivenOtherAggregatorsAreRefusedSayingWhatDiffers) {
  auto a = TestAggregator::Start({});
  auto b = TestAggregator::Start({});
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  auto first = Client::Connect(Opts(a->address(), "lists", 2, 0));
  ASSERT_TRUE(first.ok()) << first.status();
  ClientOptions more = Opts(a->address(), "lists", 2, 1);
  more.aggregators.push_back(b->address());
  auto refused = Client::Connect(more);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find(absl::StrCat("only rank 1 lists ", b->address())), std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("must list the same aggregators in the same order"), std::string::npos);

  ClientOptions ab = Opts(a->address(), "order", 2, 0), ba = Opts(b->address(), "order", 2, 1);
  ab.aggregators.push_back(b->address());
  ba.aggregators.push_back(a->address());
  auto in_order = Client::Connect(ab);
  ASSERT_TRUE(in_order.ok()) << in_order.status();
  auto reordered = Client::Connect(ba);
  ASSERT_EQ(reordered.status().code(), absl::StatusCode::kFailedPrecondition) << reordered.status();
  EXPECT_NE(reordered.status().message().find("the same aggregators in another order"), std::string::npos)
      << reordered.status();
}

// chunk_bytes 0 fits the transport; a chunk too large for its datagrams is refused with the
// largest that fits; a worker on another data plane (here: a queue pair number sent to a UDP
// aggregator) is refused at join, naming both.
TEST(ClientErrors, ChunksFitTheDataPlaneAndJoinsMatchIt) {
  auto agg = TestAggregator::Start({});
  ASSERT_NE(agg, nullptr);
  ClientOptions o = Opts(agg->address(), "fit");
  o.chunk_bytes = 0;
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ((*c)->chunk_bytes(), ClientOptions::kDefaultChunkBytes);
  EXPECT_EQ((*c)->transport_kind(), TransportOptions::Kind::kUdp);
  std::vector<float> v = {1, 2, 3};
  ASSERT_TRUE((*c)->AllReduce(1, absl::MakeSpan(v)).get().ok());
  EXPECT_EQ(v, (std::vector<float>{1, 2, 3}));

  o = Opts(agg->address(), "fit-large");
  o.transport.max_datagram = 2048;
  o.chunk_bytes = 2000;
  auto big = Client::Connect(o);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument) << big.status();
  EXPECT_NE(big.status().message().find("use at most 1992, or 0 to fit"), std::string::npos) << big.status();

  auto channel = grpc::CreateChannel(agg->address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Aggregator::NewStub(channel);
  v1::JoinRequest req;
  req.set_job_name("rdma-worker");
  req.set_world_size(1);
  req.set_chunk_bytes(968);
  req.set_data_host("127.0.0.1");
  req.set_data_qpn(17);
  req.set_data_qkey(0x0d1c0001);
  v1::JoinResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Status st = stub->Join(&ctx, req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_NE(st.error_message().find("serves data over UDP but the worker joined with RDMA"), std::string::npos)
      << st.error_message();
}

TEST(ClientErrors, RoundsInFlightCapGivesResourceExhausted) {
  TestAggregatorOptions ao;
  ao.limits.max_rounds_in_flight = 4;  // clients are told 4 / (2 x 1 data thread) = 2
  auto agg = TestAggregator::Start(ao);
  ASSERT_NE(agg, nullptr);
  auto c = Client::Connect(Opts(agg->address(), "capped", 2, 0));
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<std::vector<float>> d(3, std::vector<float>(10, 1));
  auto f0 = (*c)->AllReduce(0, absl::MakeSpan(d[0]));
  auto f1 = (*c)->AllReduce(1, absl::MakeSpan(d[1]));
  auto f2 = (*c)->AllReduce(2, absl::MakeSpan(d[2]));
  auto r2 = f2.get();
  EXPECT_EQ(r2.status().code(), absl::StatusCode::kResourceExhausted) << r2.status();
  EXPECT_NE(r2.status().message().find("in flight"), std::string::npos);
  ASSERT_TRUE((*c)->Close().ok());
}

TEST(ClientErrors, AggregatorCapacityErrorReachesTheCaller) {
  // A tensor whose accumulator exceeds the job's byte budget is refused by the aggregator, and the
  // refusal (not a timeout) is what the caller sees.
  TestAggregatorOptions ao;
  ao.limits.max_job_bytes = 1 << 20;
  auto agg = TestAggregator::Start(ao);
  ASSERT_NE(agg, nullptr);
  ClientOptions o = Opts(agg->address(), "budget", 2, 0);
  o.chunk_bytes = 4096;
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<float> big(1 << 20, 1.0f);  // 4 MiB of accumulator, over the 1 MiB budget
  auto r = (*c)->AllReduce(0, absl::MakeSpan(big)).get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_NE(r.status().message().find("max-job-bytes"), std::string::npos) << r.status();
}

// Jobs that each fit their own budget but together exceed the aggregator's (--max-memory-bytes):
// the one that finds it full is refused, naming the setting, while the other's round completes;
// once that round is freed, the refused one runs.
TEST(ClientErrors, TheAggregatorsMemoryCapOverAllJobsRefusesTheJobThatFindsItFull) {
  TestAggregatorOptions ao;
  ao.limits.max_job_bytes = 3 << 20;
  ao.limits.max_memory_bytes = 4 << 20;
  auto agg = TestAggregator::Start(ao);
  ASSERT_NE(agg, nullptr);
  // Rank 0 of "holder" pushes 3 MiB; rank 1 never does, so the round holds them.
  std::vector<std::unique_ptr<Client>> holder = ConnectAll(agg->address(), "holder", 2);
  ASSERT_NE(holder[0], nullptr);
  ASSERT_NE(holder[1], nullptr);
  std::vector<float> three((3 << 20) / 4, 1.0f);
  auto held = holder[0]->AllReduce(0, absl::MakeSpan(three));
  // The accumulator is taken as the pushes arrive: wait until it is.
  const absl::Time deadline = MonotonicNow() + absl::Seconds(5);
  while (agg->jobs().List().empty() || agg->jobs().List()[0]->bytes_in_use.load() < (3u << 20)) {
    ASSERT_LT(MonotonicNow(), deadline) << "the first job's round never took its memory";
    absl::SleepFor(absl::Milliseconds(10));
  }
  ClientOptions o2 = Opts(agg->address(), "latecomer", 1, 0);
  o2.chunk_bytes = 4096;
  auto late = Client::Connect(o2);
  ASSERT_TRUE(late.ok()) << late.status();
  std::vector<float> two((2 << 20) / 4, 1.0f);
  auto r = (*late)->AllReduce(0, absl::MakeSpan(two)).get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_NE(r.status().message().find("--max-memory-bytes"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("job 'latecomer'"), std::string::npos) << r.status();
  // The refused round gave back what it had taken before the cap stopped it, at once: the worker
  // said it was done with the round, so no late push of it can take memory once the holder leaves.
  auto latecomer_bytes = [&] {
    for (const auto& job : agg->jobs().List()) {
      if (job->name == "latecomer") return job->bytes_in_use.load();
    }
    return uint64_t{0};
  };
  for (const absl::Time end = MonotonicNow() + absl::Seconds(5); latecomer_bytes() != 0;) {
    ASSERT_LT(MonotonicNow(), end) << "the refused round still holds " << latecomer_bytes() << " bytes";
    absl::SleepFor(absl::Milliseconds(10));
  }
  // The holder ends: its round is dropped and its memory given back.
  holder[0]->Close().IgnoreError();
  holder[1]->Close().IgnoreError();
  EXPECT_FALSE(held.get().ok());
  std::vector<float> again((2 << 20) / 4, 1.0f);
  absl::StatusOr<RoundStats> ok = absl::UnknownError("not run");
  for (const absl::Time end = MonotonicNow() + absl::Seconds(5); MonotonicNow() < end;) {
    ok = (*late)->AllReduce(1, absl::MakeSpan(again)).get();
    if (ok.ok()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(again[0], 1.0f);
}

// Tensors of different lengths for one key fail at once on every worker, naming both lengths
// and the ranks, rather than each running into its op deadline; the job goes on.
TEST(ClientErrors, TensorsOfDifferentLengthsForOneKeyFailAtOnceNamingBoth) {
  auto agg = TestAggregator::Start({});
  ASSERT_NE(agg, nullptr);
  std::vector<std::unique_ptr<Client>> clients = ConnectAll(agg->address(), "lengths", 2);
  ASSERT_NE(clients[0], nullptr);
  ASSERT_NE(clients[1], nullptr);
  const absl::Time start = MonotonicNow();
  std::vector<float> a(500, 1.0f), b(1000, 2.0f);
  auto fa = clients[0]->AllReduce(7, absl::MakeSpan(a));
  auto fb = clients[1]->AllReduce(7, absl::MakeSpan(b));
  for (auto* f : {&fa, &fb}) {
    absl::StatusOr<RoundStats> r = f->get();
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
    const std::string m(r.status().message());
    const bool one_way = m.find("rank 1 all-reduces a tensor of 1000 elements, rank 0 one of 500") != std::string::npos;
    const bool other_way = m.find("rank 0 all-reduces a tensor of 500 elements, rank 1 one of 1000") != std::string::npos;
    EXPECT_TRUE(one_way || other_way) << m;
    EXPECT_NE(m.find("job 'lengths' key 7 round 0"), std::string::npos) << m;
  }
  EXPECT_LT(MonotonicNow() - start, absl::Seconds(3)) << "not at once: the op deadline is 5 s";
  EXPECT_EQ(TwoWorkerRound(clients, 1, 2), std::make_pair(3.0f, 3.0f));
  std::vector<float> c(500, 1.0f), d(500, 2.0f);
  auto fc = clients[0]->AllReduce(7, absl::MakeSpan(c));
  auto fd = clients[1]->AllReduce(7, absl::MakeSpan(d));
  ASSERT_TRUE(fc.get().ok());
  ASSERT_TRUE(fd.get().ok());
  EXPECT_EQ(c, std::vector<float>(500, 3.0f));
}

// One client creating job after job under new names is refused past --max-jobs-per-client,
// by its address (plaintext), and the refusal says so; a job of its own it can still join.
TEST(ClientErrors, OneClientCannotTakeEveryJobSlot) {
  TestAggregatorOptions ao;
  ao.limits.max_jobs_per_client = 3;
  auto agg = TestAggregator::Start(ao);
  ASSERT_NE(agg, nullptr);
  std::vector<std::unique_ptr<Client>> held;
  for (int i = 0; i < 3; ++i) {
    auto c = Client::Connect(Opts(agg->address(), absl::StrCat("slot-", i), 2, 0));
    ASSERT_TRUE(c.ok()) << c.status();
    held.push_back(std::move(*c));
  }
  auto fourth = Client::Connect(Opts(agg->address(), "slot-3", 2, 0));
  EXPECT_EQ(fourth.status().code(), absl::StatusCode::kResourceExhausted) << fourth.status();
  EXPECT_NE(fourth.status().message().find("job 'slot-3' refused: address 127.0.0.1 already created 3 of the jobs"),
            std::string::npos)
      << fourth.status();
  EXPECT_NE(fourth.status().message().find("--max-jobs-per-client"), std::string::npos) << fourth.status();
  auto peer = Client::Connect(Opts(agg->address(), "slot-0", 2, 1));  // the other rank of a job it has
  EXPECT_TRUE(peer.ok()) << peer.status();
}

// After the last round an aggregator may go away, or come back knowing nothing of the job, before
// the client notices: Close must not fail the finished job over a Leave with nothing left to do,
// nor wait out a deadline for it.
TEST(ClientErrors, ClosingAfterAnAggregatorWentAwayIsNotAnError) {
  for (const bool restarted : {false, true}) {
    SCOPED_TRACE(restarted ? "restarted without the job" : "gone");
    auto keep = TestAggregator::Start({});
    auto doomed = TestAggregator::Start({});
    ASSERT_NE(keep, nullptr);
    ASSERT_NE(doomed, nullptr);
    ClientOptions o = Opts(keep->address(), "gone-at-close");
    o.aggregators.push_back(doomed->address());
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    std::vector<float> d(1000, 2);
    absl::StatusOr<RoundStats> r = (*c)->AllReduce(1, absl::MakeSpan(d)).get();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(d[0], 2);
    EXPECT_EQ(d[999], 2);
    TestAggregatorOptions again;
    again.control_port = doomed->port();
    doomed.reset();  // its heartbeat deadline (seconds) is far off: the client has not noticed
    if (restarted) {
      doomed = TestAggregator::Start(again);
      ASSERT_NE(doomed, nullptr);
    }
    const absl::Time start = MonotonicNow();
    absl::Status closed = (*c)->Close();
    EXPECT_TRUE(closed.ok()) << closed;
    EXPECT_LT(MonotonicNow() - start, o.rpc_timeout);
  }
}

}  // namespace
}  // namespace dlcp::testing
