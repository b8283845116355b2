// The data plane refuses what it must: garbage, replays, pushes and results forged by members of
// the job, clients that predate its keys, requests for results already on their way, and
// repairs of pushes still on theirs. Real clients against an in-process aggregator, with sockets
// of the test's own.
#include <gtest/gtest.h>

#include <grpcpp/grpcpp.h>

#include <arpa/inet.h>
#include <netinet/ip.h>
#include <netinet/udp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <iostream>
#include <map>
#include <future>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "common/base/clock.h"
#include "common/datapath/outbox.h"
#include "common/wire/header.h"
#include "common/wire/mac.h"
#include "common/wire/ranges.h"
#include "dlcp/v1/control.grpc.pb.h"
#include "server/jobs/job_registry.h"
#include "tests/integration/client_test_util.h"
#include "tests/integration/test_aggregator.h"
#include "common/transport/factory.h"

namespace dlcp::testing {
namespace {

TEST(DataPlaneValidation, GarbageIsCountedAndAJobStaysExact) {
  auto agg = TestAggregator::Start({});
  ASSERT_NE(agg, nullptr);
  const Address target = agg->data().endpoints()[0];
  std::atomic<bool> stop{false};
  std::thread flood([&] {
    TransportOptions t;
    t.bind_host = "127.0.0.1";
    auto tx = CreateTransport(t);
    ASSERT_TRUE(tx.ok());
    std::mt19937 rng(3);
    std::vector<uint8_t> junk(2000);
    wire::Header h;
    h.type = wire::MsgType::kPush;
    h.job = 12345;  // no such job
    h.chunk_count = 1;
    h.tensor_elems = 4;
    h.payload_len = 16;
    // Well-formed pushes for the real job: unsigned, and signed with a key that is not the job's.
    wire::Header forged = h;
    forged.job = server::JobIdForName("under-fire");
    forged.chunk_count = 5;
    forged.tensor_elems = 20000;
    forged.payload_len = 1024;
    std::vector<uint8_t> unsigned_push(48), signed_push(48), tag(8);
    wire::EncodeHeader(forged, unsigned_push.data());
    forged.flags = wire::kFlagMac;
    wire::EncodeHeader(forged, signed_push.data());
    auto wrong_key = wire::NewMacKey();
    ASSERT_TRUE(wrong_key.ok());
    std::vector<uint8_t> old_version = unsigned_push, lying = unsigned_push;
    old_version[4] = 0;  // version 0
    lying[40] = 0xff;    // payload_len claims more than the datagram holds
    lying[41] = 0x0f;
    while (!stop.load()) {
      for (auto& b : junk) b = static_cast<uint8_t>(rng());
      wire::EncodeHeader(h, junk.data());
      wire::ComputeMac(*wrong_key, signed_push.data(), junk.data(), 1024, tag.data());
      OutMessage msgs[7] = {{target, 0, junk.data() + 64, 100, nullptr, 0},               // random bytes
                            {target, 0, junk.data() + 64, 20, nullptr, 0},                // truncated
                            {target, 0, old_version.data(), 48, junk.data(), 1024},       // wrong version
                            {target, 0, lying.data(), 48, junk.data(), 1024},             // length lies
                            {target, 0, junk.data(), 48, junk.data() + 48, 16},           // unknown job
                            {target, 0, unsigned_push.data(), 48, junk.data(), 1024},     // no MAC
                            {target, 0, signed_push.data(), 48, junk.data(), 1024, tag.data(), 8}};  // bad MAC
      (void)(*tx)->Send(msgs, MonotonicNow() + absl::Seconds(1));
      absl::SleepFor(absl::Microseconds(200));
    }
  });
  std::vector<std::string> errors(2);
  std::vector<std::thread> workers;
  for (int r = 0; r < 2; ++r) {
    workers.emplace_back([&, r] {
      auto c = Client::Connect(Opts(agg->address(), "under-fire", 2, r));
      if (!c.ok()) return void(errors[r] = c.status().ToString());
      for (int k = 0; k < 40; ++k) {
        std::vector<float> d(100000, static_cast<float>(r + k));
        auto s = (*c)->AllReduce(0, absl::MakeSpan(d)).get();
        if (!s.ok()) return void(errors[r] = s.status().ToString());
        for (float v : d) {
          if (v != static_cast<float>(1 + 2 * k)) return void(errors[r] = "inexact");
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  const double flood_during_job = agg->Counter("dlcp_rejects_total{reason=\"bad_mac\"}");
  stop = true;
  flood.join();
  EXPECT_GE(flood_during_job, 10) << "the flood hardly overlapped the job";
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  for (const char* reason : {"bad_magic", "truncated", "bad_version", "length_mismatch", "unknown_job"}) {
    EXPECT_GT(agg->Counter(absl::StrCat("dlcp_rejects_total{reason=\"", reason, "\"}")), 0) << reason;
  }
  EXPECT_GT(agg->Counter("dlcp_rejects_total{reason=\"missing_mac\"}"), 0);
  EXPECT_GT(agg->Counter("dlcp_rejects_total{reason=\"bad_mac\"}"), 0);
}

// A datagram of `type` for `chunk` of key 3 (as TwoWorkerRound runs it) in `round`, to or from
// `rank`, every value `value`, signed with `key`: header, payload and MAC trailer. A result says
// both workers contributed.
std::vector<uint8_t> Key3Datagram(wire::MsgType type, const server::Job& job, const wire::MacKey& key, uint16_t rank,
                                  uint32_t round, uint32_t chunk, float value) {
  wire::Header h;
  h.type = type;
  h.priority = 1;
  h.job = job.id;
  h.key = 3;
  h.round = round;
  h.chunk = chunk;
  h.chunk_count = 2;
  h.tensor_elems = 500;
  h.rank = rank;
  h.epoch = job.epoch;
  if (type == wire::MsgType::kResult) h.contributors = 2;
  h.flags = wire::kFlagMac;
  std::vector<float> values(chunk == 0 ? 256 : 244, value);
  h.payload_len = static_cast<uint32_t>(values.size() * sizeof(float));
  std::vector<uint8_t> d(wire::kHeaderSize + h.payload_len + wire::kMacSize);
  wire::EncodeHeader(h, d.data());
  std::memcpy(d.data() + wire::kHeaderSize, values.data(), h.payload_len);
  wire::ComputeMac(key, d.data(), d.data() + wire::kHeaderSize, h.payload_len, d.data() + wire::kHeaderSize + h.payload_len);
  return d;
}

// Sends `copies` of a push of `chunk` of key 3 for `round` as `rank`, every value `value`, signed
// with `key`, from `tx`.
void SendPush(Transport& tx, TestAggregator& agg, const server::Job& job, const wire::MacKey& key, uint16_t rank,
              uint32_t round, float value, int copies, uint32_t chunk = 0) {
  const std::vector<uint8_t> d = Key3Datagram(wire::MsgType::kPush, job, key, rank, round, chunk, value);
  OutMessage m{agg.data().endpoints()[0], 1, d.data(), d.size()};
  for (int i = 0; i < copies; ++i) ASSERT_TRUE(tx.Send({&m, 1}, MonotonicNow() + absl::Seconds(1)).ok());
}

// An aggregator, and both ranks of two-worker job `name` connected to it.
struct TwoWorkers {
  std::unique_ptr<TestAggregator> agg;
  std::vector<std::unique_ptr<Client>> clients;
  std::shared_ptr<server::Job> job;
};
void StartTwoWorkers(const std::string& name, const TestAggregatorOptions& options, TwoWorkers* out) {
  out->agg = TestAggregator::Start(options);
  ASSERT_NE(out->agg, nullptr);
  out->clients = ConnectAll(out->agg->address(), name, 2);
  ASSERT_NE(out->clients[0], nullptr);
  ASSERT_NE(out->clients[1], nullptr);
  out->job = out->agg->jobs().Find(server::JobIdForName(name));
  ASSERT_NE(out->job, nullptr);
}

// Sends `h` with `payload` (h.payload_len bytes) from `tx` to the aggregator as member h.rank of
// `job` would: the job's id and epoch filled in, signed with that rank's key.
void SendAsMember(Transport& tx, TestAggregator& agg, const server::Job& job, wire::Header h, const uint8_t* payload) {
  h.job = job.id;
  h.epoch = job.epoch;
  h.flags |= wire::kFlagMac;
  uint8_t header[wire::kHeaderSize], tag[wire::kMacSize];
  wire::EncodeHeader(h, header);
  wire::ComputeMac(*job.worker_key(h.rank), header, payload, h.payload_len, tag);
  OutMessage m{agg.data().endpoints()[0], 1, header, wire::kHeaderSize, payload, h.payload_len, tag, wire::kMacSize};
  ASSERT_TRUE(tx.Send({&m, 1}, MonotonicNow() + absl::Seconds(1)).ok());
}

// A member's genuine, correctly signed packet of a finished round, sent again later (a replay),
// must change nothing: it is counted as stale and the next rounds stay exact.
TEST(DataPlaneValidation, ReplayOfAnOldRoundIsIgnored) {
  TwoWorkers w;
  ASSERT_NO_FATAL_FAILURE(StartTwoWorkers("replay", {}, &w));
  auto& [agg, clients, job] = w;
  EXPECT_EQ(TwoWorkerRound(clients, 1, 2), std::make_pair(3.0f, 3.0f));
  EXPECT_EQ(TwoWorkerRound(clients, 10, 20), std::make_pair(30.0f, 30.0f));
  ASSERT_NE(job->keys(), nullptr);
  const double stale_before = agg->Counter("dlcp_stale_packets_total");
  // Rank 0's round-0 push of chunk 0 exactly as it was sent, signed with rank 0's key.
  std::unique_ptr<Transport> tx = TestSocket();
  ASSERT_NE(tx, nullptr);
  SendPush(*tx, *agg, *job, *job->worker_key(0), 0, 0, 1.0f, 5);
  // At least the 5 copies: a late packet of the workers' own last round (a result request sent
  // as it ended) may be counted stale here too; a CI run saw 6.
  EXPECT_GE(agg->WaitForCounter("dlcp_stale_packets_total", stale_before + 5) - stale_before, 5);
  EXPECT_EQ(agg->Counter("dlcp_rejects_total{reason=\"bad_mac\"}"), 0);  // genuine, just old
  EXPECT_EQ(TwoWorkerRound(clients, 100, 200), std::make_pair(300.0f, 300.0f));
  for (auto& c : clients) EXPECT_TRUE(c->Close().ok());
}

// The keys rank `rank` of `job` holds, as a heartbeat hands them out.
v1::HeartbeatResponse HeldKeys(TestAggregator& agg, const server::Job& job, uint32_t rank) {
  auto stub = v1::Aggregator::NewStub(grpc::CreateChannel(agg.address(), grpc::InsecureChannelCredentials()));
  v1::HeartbeatRequest hb;
  hb.set_job_id(job.id);
  hb.set_rank(rank);
  hb.set_data_key_generation(1);
  v1::HeartbeatResponse held;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Status st = stub->Heartbeat(&ctx, hb, &held);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return held;
}

wire::MacKey KeyOf(const std::string& bytes) {
  EXPECT_EQ(bytes.size(), 32u);
  if (bytes.size() != 32) return {};
  return wire::MacKeyFromBytes(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
}

// Per-worker keys (docs/security.md): a member holds the key results are checked with and a key
// of its own rank, and with neither can it push as another rank. Rank 0 forges rank 1's push of
// the next round with each key it holds; both are refused as forged, and the round's sum is
// rank 1's own. (With one key for the whole job the forgery would be summed, and rank 1's real
// push dropped as a duplicate.)
TEST(DataPlaneValidation, AMemberCannotPushAsAnotherRank) {
  TwoWorkers w;
  ASSERT_NO_FATAL_FAILURE(StartTwoWorkers("impersonate", {}, &w));
  auto& [agg, clients, job] = w;
  EXPECT_EQ(TwoWorkerRound(clients, 1, 2), std::make_pair(3.0f, 3.0f));

  // What rank 0 holds, as its heartbeats hand it out.
  v1::HeartbeatResponse held = HeldKeys(*agg, *job, 0);
  ASSERT_EQ(held.data_key().size(), 32u);
  ASSERT_EQ(held.worker_key().size(), 32u);
  const wire::MacKey results = KeyOf(held.data_key()), own = KeyOf(held.worker_key());
  EXPECT_EQ(own, *job->worker_key(0));
  EXPECT_NE(own, *job->worker_key(1));
  EXPECT_NE(results, job->keys()->newest->secret);  // the secret never leaves the aggregator

  std::unique_ptr<Transport> tx = TestSocket();
  ASSERT_NE(tx, nullptr);
  for (const wire::MacKey& key : {own, results}) SendPush(*tx, *agg, *job, key, 1, 1, 1000.0f, 1);
  EXPECT_EQ(agg->WaitForCounter("dlcp_rejects_total{reason=\"bad_mac\"}", 2), 2);
  EXPECT_EQ(TwoWorkerRound(clients, 10, 20), std::make_pair(30.0f, 30.0f));
  for (auto& c : clients) EXPECT_TRUE(c->Close().ok());
}

// Per-worker keys cover results too: the aggregator signs what it sends each member with a key of
// that member's rank, so no member can sign a result another accepts. Rank 1 here is a socket of
// the test's own, joined by hand, so it sees the results it is sent as they arrive; rank 0 is a
// real client. Each result to rank 1 must check out under rank 1's key and not under any key rank
// 0 holds. With one key for the job (--per-worker-data-keys=false) rank 0's key checks them too,
// so rank 0 could have forged them.
TEST(DataPlaneValidation, AMemberCannotSignAResultAnotherAccepts) {
  for (const bool per_worker : {true, false}) {
    SCOPED_TRACE(per_worker ? "per-worker keys" : "one key for the job");
    TestAggregatorOptions ao;
    ao.limits.per_worker_data_keys = per_worker;
    auto agg = TestAggregator::Start(ao);
    ASSERT_NE(agg, nullptr);
    std::unique_ptr<Transport> rank1 = TestSocket();
    ASSERT_NE(rank1, nullptr);
    std::future<absl::StatusOr<std::unique_ptr<Client>>> rank0 =
        std::async(std::launch::async, [&] { return Client::Connect(Opts(agg->address(), "forge-result", 2, 0)); });
    v1::JoinResponse joined;
    grpc::Status st = agg->Join(TestAggregator::HandJoin("forge-result", 2, 1, rank1->local_address().port), &joined);
    ASSERT_TRUE(st.ok()) << st.error_message();
    absl::StatusOr<std::unique_ptr<Client>> client = rank0.get();
    ASSERT_TRUE(client.ok()) << client.status();
    std::shared_ptr<server::Job> job = agg->jobs().Find(server::JobIdForName("forge-result"));
    ASSERT_NE(job, nullptr);
    const wire::MacKey mine = KeyOf(joined.data_key());
    const wire::MacKey signs = joined.worker_key().empty() ? mine : KeyOf(joined.worker_key());
    const v1::HeartbeatResponse other = HeldKeys(*agg, *job, 0);
    EXPECT_EQ(KeyOf(other.data_key()) == mine, !per_worker);

    std::vector<float> d0(500, 1.0f);
    auto f0 = (*client)->AllReduce(3, absl::MakeSpan(d0));
    for (uint32_t chunk : {0u, 1u}) SendPush(*rank1, *agg, *job, signs, 1, 0, 2.0f, 1, chunk);
    ASSERT_TRUE(f0.get().ok());
    EXPECT_EQ(d0, std::vector<float>(500, 3.0f));

    std::set<uint32_t> results;
    std::vector<InMessage> in;
    for (const absl::Time end = MonotonicNow() + absl::Seconds(5); results.size() < 2 && MonotonicNow() < end;) {
      ASSERT_TRUE(rank1->Receive(&in, absl::Milliseconds(100)).ok());
      for (const InMessage& m : in) {
        wire::Header h;
        const absl::Span<const uint8_t> datagram(m.data, m.len);
        ASSERT_EQ(wire::ParseHeader(datagram, &h), wire::Reject::kNone);
        if (h.type != wire::MsgType::kResult) continue;
        ASSERT_TRUE(h.flags & wire::kFlagMac);
        EXPECT_TRUE(wire::VerifyMac(mine, datagram, h.payload_len)) << "chunk " << h.chunk;
        for (const std::string& held : {other.data_key(), other.worker_key()}) {
          if (held.empty()) continue;
          EXPECT_EQ(wire::VerifyMac(KeyOf(held), datagram, h.payload_len), !per_worker) << "chunk " << h.chunk;
        }
        results.insert(h.chunk);
      }
    }
    EXPECT_EQ(results, (std::set<uint32_t>{0, 1}));
    EXPECT_TRUE((*client)->Close().ok());
  }
}

// Sends `payload` as one UDP datagram that claims to come from `from`, through a raw socket: what a
// member able to spoof the aggregator's address would send. False where the test may not open
// raw sockets (it needs CAP_NET_RAW; CI runs as root).
bool SendSpoofed(const Address& from, const Address& to, const std::vector<uint8_t>& payload) {
  const int fd = ::socket(AF_INET, SOCK_RAW, IPPROTO_RAW);  // IPPROTO_RAW: we write the IP header
  if (fd < 0) return false;
  std::vector<uint8_t> packet(sizeof(iphdr) + sizeof(udphdr) + payload.size());
  auto* ip = reinterpret_cast<iphdr*>(packet.data());
  ip->version = 4;
  ip->ihl = 5;
  ip->ttl = 64;
  ip->protocol = IPPROTO_UDP;
  ip->tot_len = htons(static_cast<uint16_t>(packet.size()));
  ip->saddr = htonl(from.ipv4);
  ip->daddr = htonl(to.ipv4);  // the kernel fills in the checksum and id
  auto* udp = reinterpret_cast<udphdr*>(packet.data() + sizeof(iphdr));
  udp->source = htons(from.port);
  udp->dest = htons(to.port);
  udp->len = htons(static_cast<uint16_t>(sizeof(udphdr) + payload.size()));
  udp->check = 0;  // none, which IPv4 allows
  std::copy(payload.begin(), payload.end(), packet.begin() + sizeof(iphdr) + sizeof(udphdr));
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_addr.s_addr = htonl(to.ipv4);
  const ssize_t n = ::sendto(fd, packet.data(), packet.size(), 0, reinterpret_cast<sockaddr*>(&dst), sizeof(dst));
  ::close(fd);
  return n == static_cast<ssize_t>(packet.size());
}

// What a client drops it counts by reason (Client::Rejects), and a result forged by another
// member is one of those drops even when it comes from the aggregator's own address. Rank 1 has
// its round in flight; rank 0 sends it, with the results key rank 0 holds, a complete result of
// 1000s: from a socket of its own (unknown_source), and spoofed from the aggregator's data
// endpoint (bad_mac). Garbage counts too. The round then ends exact. With one key for the job
// (--per-worker-data-keys=false) the spoofed forgery is what rank 1 takes as its sum.
TEST(DataPlaneValidation, AClientCountsWhatItDropsAndRefusesAResultForgedByAnotherMember) {
  for (const bool per_worker : {true, false}) {
    SCOPED_TRACE(per_worker ? "per-worker keys" : "one key for the job");
    TestAggregatorOptions ao;
    ao.limits.per_worker_data_keys = per_worker;
    TwoWorkers w;
    ASSERT_NO_FATAL_FAILURE(StartTwoWorkers("forged-result", ao, &w));
    auto& [agg, clients, job] = w;
    const Address victim = job->members[1].address();
    const wire::MacKey held = KeyOf(HeldKeys(*agg, *job, 0).data_key());  // rank 0's results key

    std::vector<float> d1(500, 2.0f);
    auto f1 = clients[1]->AllReduce(3, absl::MakeSpan(d1));
    // Its op is in flight once its pushes have reached the aggregator. Before that, its I/O thread
    // may not have taken the op yet, and would drop any result for it, forged or not.
    const auto pushes = [&] {
      double n = 0;
      for (int c = 0; c < 4; ++c) n += agg->Counter(absl::StrCat("dlcp_rx_packets_total{class=\"", c, "\",type=\"push\"}"));
      return n;
    };
    for (const absl::Time end = MonotonicNow() + absl::Seconds(5); pushes() < 2 && MonotonicNow() < end;) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_EQ(pushes(), 2);
    std::unique_ptr<Transport> tx = TestSocket();
    ASSERT_NE(tx, nullptr);
    std::vector<std::vector<uint8_t>> own{{1, 2, 3}};  // truncated
    for (uint32_t chunk : {0u, 1u}) own.push_back(Key3Datagram(wire::MsgType::kResult, *job, held, 1, 0, chunk, 1000.0f));
    for (const std::vector<uint8_t>& d : own) {
      OutMessage m{victim, 1, d.data(), d.size()};
      ASSERT_TRUE(tx->Send({&m, 1}, MonotonicNow() + absl::Seconds(1)).ok());
    }
    bool spoofed = true;
    for (uint32_t chunk : {0u, 1u}) {
      spoofed = spoofed && SendSpoofed(agg->data().endpoints()[0], victim,
                                       Key3Datagram(wire::MsgType::kResult, *job, held, 1, 0, chunk, 1000.0f));
    }
    if (per_worker) {
      std::map<std::string, uint64_t> expected{{"truncated", 1}, {"unknown_source", 2}};
      if (spoofed) expected["bad_mac"] = 2;
      std::map<std::string, uint64_t> rejects;
      for (const absl::Time end = MonotonicNow() + absl::Seconds(5); rejects != expected && MonotonicNow() < end;) {
        absl::SleepFor(absl::Milliseconds(10));
        rejects = clients[1]->Rejects();
      }
      EXPECT_EQ(rejects, expected);
      EXPECT_EQ(f1.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout) << "rank 1 took a forgery";
    }
    std::vector<float> d0(500, 1.0f);
    ASSERT_TRUE(clients[0]->AllReduce(3, absl::MakeSpan(d0)).get().ok());
    ASSERT_TRUE(f1.get().ok());
    EXPECT_EQ(d0, std::vector<float>(500, 3.0f));
    if (!spoofed) {
      std::cerr << "no raw sockets here (not root): the spoofed forgery was not tried\n";
    } else {
      EXPECT_EQ(d1, std::vector<float>(500, per_worker ? 3.0f : 1000.0f));
    }
    EXPECT_EQ(clients[0]->Rejects().count("bad_mac"), 0u) << "nothing forged was sent to rank 0";
    for (auto& c : clients) EXPECT_TRUE(c->Close().ok());
  }
}

// A client from before per-worker keys would sign with the job's shared key and see every packet
// refused; it is refused at Join instead, with the switch that lets it in named. With the switch
// off the same request joins, and gets the shared key only.
TEST(DataPlaneValidation, AClientFromBeforeWorkerKeysIsRefusedAtJoinNamingTheSwitch) {
  v1::JoinRequest req;
  req.set_job_name("old-client");
  req.set_world_size(1);
  req.set_chunk_bytes(1024);
  req.set_data_host("127.0.0.1");
  req.set_data_port(9);
  auto join = [&](TestAggregator& agg, v1::JoinResponse* resp) {
    auto stub = v1::Aggregator::NewStub(grpc::CreateChannel(agg.address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return stub->Join(&ctx, req, resp);
  };
  auto agg = TestAggregator::Start({});
  ASSERT_NE(agg, nullptr);
  v1::JoinResponse resp;
  grpc::Status st = join(*agg, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_NE(st.error_message().find("run dlcpd with --per-worker-data-keys=false"), std::string::npos)
      << st.error_message();
  EXPECT_TRUE(agg->jobs().List().empty());

  TestAggregatorOptions shared;
  shared.limits.per_worker_data_keys = false;
  auto open = TestAggregator::Start(shared);
  ASSERT_NE(open, nullptr);
  st = join(*open, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.data_key().size(), 32u);
  EXPECT_TRUE(resp.worker_key().empty());
}

// A worker that keeps asking for results whose copies are still on their way (behind congestion,
// say) must not make the aggregator send them again each time: answering every request in full
// set off storms of results that held rounds for 10-40 s (docs/congestion.md). Rank 1 here is
// driven by hand: its pushes complete the round late, so the round's repair interval is long,
// and then it asks again and again for every result, through the real data thread.
TEST(DataPlaneValidation, RequestsForResultsOnTheirWayAreNotAnsweredAgain) {
  TestAggregatorOptions ao;
  ao.repair_timeout = absl::Seconds(3);  // the interval follows the round's pace, up to this
  TwoWorkers w;
  ASSERT_NO_FATAL_FAILURE(StartTwoWorkers("asks-again", ao, &w));
  auto& [agg, clients, job] = w;
  ASSERT_NE(job->keys(), nullptr);

  constexpr uint32_t kChunks = 8, kElems = kChunks * 256;  // 1024-byte chunks of float32
  std::vector<float> d0(kElems, 1.0f);
  auto f0 = clients[0]->AllReduce(7, absl::MakeSpan(d0));
  // Rank 0's pushes open the round; rank 1's come 600 ms later, so the round's 16 contributions
  // span 600 ms and 16 of its mean gaps (the repair interval) are about as long.
  absl::SleepFor(absl::Milliseconds(600));
  TransportOptions t;
  t.bind_host = "127.0.0.1";
  auto tx = CreateTransport(t);
  ASSERT_TRUE(tx.ok());
  auto send = [&](wire::Header h, const uint8_t* payload) {
    h.key = 7;
    h.round = 0;
    h.chunk_count = kChunks;
    h.tensor_elems = kElems;
    h.rank = 1;
    SendAsMember(**tx, *agg, *job, h, payload);
  };
  std::vector<float> twos(256, 2.0f);
  for (uint32_t c = 0; c < kChunks; ++c) {
    wire::Header h;
    h.type = wire::MsgType::kPush;
    h.priority = 1;
    h.chunk = c;
    h.payload_len = 1024;
    send(h, reinterpret_cast<const uint8_t*>(twos.data()));
  }
  auto result = f0.get();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(d0, std::vector<float>(kElems, 3.0f));

  const std::vector<uint8_t> all = wire::EncodeRanges(std::vector<wire::ChunkRange>{{0, kChunks}}, 1024)[0];
  auto ask = [&](int times) {
    for (int i = 0; i < times; ++i) {
      wire::Header h;
      h.type = wire::MsgType::kResultReq;
      h.chunk = kChunks;  // pushed through the last chunk
      h.payload_len = static_cast<uint32_t>(all.size());
      send(h, all.data());
    }
  };
  // Each request counts every chunk once, as sent again or as not; the waits below are for the
  // data thread to have handled them.
  const char* kResent = "dlcp_repairs_total{kind=\"result_resent\"}";
  const char* kNotResent = "dlcp_results_not_resent_total";
  // Just sent to everyone when each chunk completed: twenty requests for all of them send nothing.
  ask(20);
  EXPECT_EQ(agg->WaitForCounter(kNotResent, 20 * kChunks), 20 * kChunks);
  EXPECT_EQ(agg->Counter(kResent), 0);
  // Once the copy had time to arrive, the next request is a loss and gets each result once.
  absl::SleepFor(absl::Milliseconds(1500));
  ask(1);
  EXPECT_EQ(agg->WaitForCounter(kResent, kChunks), kChunks);
  // Those copies are on their way in turn, for twice as long: asking at once sends nothing more.
  ask(20);
  EXPECT_EQ(agg->WaitForCounter(kNotResent, 40 * kChunks), 40 * kChunks);
  EXPECT_EQ(agg->Counter(kResent), kChunks);
  for (auto& c : clients) EXPECT_TRUE(c->Close().ok());
}

// Pushes that come at a slow path's pace (4 ms apart, as on 10 Mbit/s) are not NACKed while
// they are still on their way: a pause of 12 ms, longer than the 5 ms repair timeout but short
// of 16 of the round's own gaps, is not silence. Real silence is, after about those 16 gaps.
TEST(DataPlaneValidation, AnAggregatorOnASlowPathWaitsOutItsRoundsOwnGapsBeforeNacking) {
  TestAggregatorOptions ao;
  ao.repair_timeout = absl::Milliseconds(5);  // dlcpd's default
  TwoWorkers w;
  ASSERT_NO_FATAL_FAILURE(StartTwoWorkers("slow-pushes", ao, &w));
  auto& [agg, clients, job] = w;
  TransportOptions t;
  t.bind_host = "127.0.0.1";
  auto tx = CreateTransport(t);
  ASSERT_TRUE(tx.ok());

  constexpr uint32_t kChunks = 64, kElems = kChunks * 256;  // 1024-byte chunks of float32
  const std::vector<float> ones(256, 1.0f);
  auto push = [&](uint32_t chunk) {
    wire::Header h;
    h.type = wire::MsgType::kPush;
    h.priority = 1;
    h.key = 9;
    h.chunk = chunk;
    h.chunk_count = kChunks;
    h.tensor_elems = kElems;
    h.rank = 0;
    h.payload_len = 1024;
    SendAsMember(**tx, *agg, *job, h, reinterpret_cast<const uint8_t*>(ones.data()));
  };
  const char* kNacks = "dlcp_repairs_total{kind=\"push_nack\"}";
  // Before 16 pushes the round has no pace yet and the timeout rules, which a late wake-up here
  // may trip: only what the aggregator does after the pace is known counts.
  for (uint32_t c = 0; c < 24; ++c) {
    ASSERT_NO_FATAL_FAILURE(push(c));
    absl::SleepFor(absl::Milliseconds(4));
  }
  const double before = agg->Counter(kNacks);
  absl::SleepFor(absl::Milliseconds(12));
  ASSERT_NO_FATAL_FAILURE(push(24));
  const absl::Time last = MonotonicNow();
  EXPECT_EQ(agg->Counter(kNacks), before) << "NACKed pushes within the round's own gaps";
  while (agg->Counter(kNacks) == before && MonotonicNow() - last < absl::Seconds(5)) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_GT(agg->Counter(kNacks), before) << "never NACKed the missing pushes";
  EXPECT_GE(MonotonicNow() - last, absl::Milliseconds(40)) << "16 gaps of 4 ms";
  for (auto& c : clients) EXPECT_TRUE(c->Close().ok());
}

// A round released while results of it are still queued to be sent must not be read after its
// release: the queue points into its memory. Here the pushes that complete each chunk of a
// one-worker round and the worker's DONE arrive together, so the round is released in the same
// batch that queued its results (as when a job closes with results in flight). Under
// AddressSanitizer a block back in the cache is poisoned (block_pool.h) and one past the cache
// is freed, so a read of either is reported; in every build, each result arrives intact, under
// the worker's results key, and no send fails.
struct ReleaseCase {
  std::string name;
  uint32_t elems;            // 256 floats a chunk
  size_t block_cache_bytes;  // 0: a released round's blocks are freed at once
};
void PrintTo(const ReleaseCase& c, std::ostream* os) { *os << c.name; }
class ReleasedRound : public ::testing::TestWithParam<ReleaseCase> {};

TEST_P(ReleasedRound, ItsQueuedResultsAreSentBeforeItsMemoryIsReused) {
  const ReleaseCase& c = GetParam();
  TestAggregatorOptions ao;
  ao.block_cache_bytes = c.block_cache_bytes;
  auto agg = TestAggregator::Start(ao);
  ASSERT_NE(agg, nullptr);
  std::unique_ptr<Transport> worker = TestSocket();
  ASSERT_NE(worker, nullptr);
  v1::JoinResponse joined;
  grpc::Status st =
      agg->Join(TestAggregator::HandJoin("released-" + c.name, 1, 0, worker->local_address().port), &joined);
  ASSERT_TRUE(st.ok()) << st.error_message();
  std::shared_ptr<server::Job> job = agg->jobs().Find(joined.job_id());
  ASSERT_NE(job, nullptr);
  const wire::MacKey results_key = KeyOf(joined.data_key());
  const wire::ChunkGeometry g{c.elems, 256};
  const uint32_t chunks = g.chunk_count();
  std::vector<float> values(c.elems);
  for (uint32_t round = 0; round < 20; ++round) {
    for (uint32_t i = 0; i < c.elems; ++i) values[i] = static_cast<float>(round * 1000 + i % 997);
    // Every chunk's push, then the DONE, in one send.
    std::vector<std::array<uint8_t, wire::kHeaderSize>> headers(chunks + 1);
    std::vector<std::array<uint8_t, wire::kMacSize>> tags(chunks + 1);
    std::vector<OutMessage> batch;
    const std::vector<uint8_t> done_payload = wire::EncodeRanges({}, 16)[0];
    for (uint32_t chunk = 0; chunk <= chunks; ++chunk) {
      wire::Header h;
      h.type = chunk < chunks ? wire::MsgType::kPush : wire::MsgType::kResultReq;
      h.flags = wire::kFlagMac | (chunk < chunks ? 0 : wire::kFlagDone);
      h.job = job->id;
      h.epoch = job->epoch;
      h.key = 7;
      h.round = round;
      h.chunk = chunk < chunks ? chunk : chunks;
      h.chunk_count = chunks;
      h.tensor_elems = c.elems;
      const uint8_t* payload = chunk < chunks ? reinterpret_cast<const uint8_t*>(values.data() + g.offset(chunk))
                                              : done_payload.data();
      h.payload_len = chunk < chunks ? g.elems(chunk) * 4 : static_cast<uint32_t>(done_payload.size());
      wire::EncodeHeader(h, headers[chunk].data());
      wire::ComputeMac(*job->worker_key(0), headers[chunk].data(), payload, h.payload_len, tags[chunk].data());
      batch.push_back({agg->data().endpoints()[0], 1, headers[chunk].data(), wire::kHeaderSize, payload, h.payload_len,
                       tags[chunk].data(), wire::kMacSize});
    }
    ASSERT_TRUE(worker->Send(batch, MonotonicNow() + absl::Seconds(2)).ok());
    std::set<uint32_t> intact;
    std::vector<InMessage> in;
    for (const absl::Time end = MonotonicNow() + absl::Seconds(10); intact.size() < chunks && MonotonicNow() < end;) {
      ASSERT_TRUE(worker->Receive(&in, absl::Milliseconds(100)).ok());
      for (const InMessage& m : in) {
        wire::Header h;
        const absl::Span<const uint8_t> datagram(m.data, m.len);
        ASSERT_EQ(wire::ParseHeader(datagram, &h), wire::Reject::kNone);
        if (h.type != wire::MsgType::kResult || h.round != round) continue;
        ASSERT_TRUE(wire::VerifyMac(results_key, datagram, h.payload_len)) << "round " << round << " chunk " << h.chunk;
        ASSERT_LT(h.chunk, chunks);
        ASSERT_EQ(h.payload_len, g.elems(h.chunk) * 4);
        ASSERT_EQ(std::memcmp(m.data + wire::kHeaderSize, values.data() + g.offset(h.chunk), h.payload_len), 0)
            << "round " << round << " chunk " << h.chunk;
        intact.insert(h.chunk);
      }
    }
    ASSERT_EQ(intact.size(), chunks) << "round " << round;
  }
  EXPECT_EQ(agg->Counter("dlcp_send_errors_total"), 0);
}

INSTANTIATE_TEST_SUITE_P(Sizes, ReleasedRound,
                         ::testing::Values(ReleaseCase{"two_chunks_cached", 500, size_t{256} << 20},
                                           ReleaseCase{"two_chunks_freed", 500, 0},
                                           ReleaseCase{"many_chunks_cached", 100000, size_t{256} << 20},
                                           ReleaseCase{"many_chunks_freed", 100000, 0}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace dlcp::testing
