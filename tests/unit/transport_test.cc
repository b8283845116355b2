#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/ip.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/build_config.h"
#include "common/base/clock.h"
#include "common/transport/factory.h"
#include "common/transport/transport.h"
#include "tests/common/ipv6_loopback.h"

namespace dlcp {
namespace {

}  // namespace

// A transport and the address it binds.
struct TransportCase {
  TransportOptions::Kind kind;
  std::string host;
  std::string name;
};

// gtest finds this by argument-dependent lookup; it names parameters in test listings.
inline void PrintTo(const TransportCase& c, std::ostream* os) { *os << c.name; }

namespace {

class TransportTest : public ::testing::TestWithParam<TransportCase> {
 protected:
  void SetUp() override {
    if (GetParam().host == "::1" && !testing::HasIpv6Loopback()) GTEST_SKIP() << testing::kNoIpv6;
    if (GetParam().kind == TransportOptions::Kind::kRdma) {
      // tests/rdma-vm runs these on Soft-RoCE, where none may skip.
      TransportOptions o;
      o.kind = TransportOptions::Kind::kRdma;
      absl::StatusOr<std::unique_ptr<Transport>> probe = CreateTransport(o);
      if (!probe.ok()) GTEST_SKIP() << "no RDMA device usable here: " << probe.status().message();
    }
  }

  std::unique_ptr<Transport> Make(size_t batch = 64, bool offload = true) {
    TransportOptions o;
    o.kind = GetParam().kind;
    // One queue pair, whose datagrams arrive in the order they were sent (UDP keeps its order over
    // its spray ports).
    if (GetParam().kind == TransportOptions::Kind::kRdma) o.spray_ports = 1;
    o.udp.gso = offload;
    o.udp.gro = offload;
    o.bind_host = GetParam().host;
    o.recv_batch = batch;
    o.socket_buffer_bytes = 8 << 20;
    auto t = CreateTransport(o);
    EXPECT_TRUE(t.ok()) << t.status();
    return std::move(*t);
  }

  // Receives until `want` messages arrived or 5 s passed.
  std::vector<std::vector<uint8_t>> Collect(Transport* t, size_t want, Address* from = nullptr) {
    std::vector<std::vector<uint8_t>> got;
    std::vector<InMessage> batch;
    const absl::Time deadline = MonotonicNow() + absl::Seconds(5);
    while (got.size() < want && MonotonicNow() < deadline) {
      EXPECT_TRUE(t->Receive(&batch, absl::Milliseconds(100)).ok());
      for (const InMessage& m : batch) {
        got.emplace_back(m.data, m.data + m.len);
        if (from) *from = m.from;
      }
    }
    return got;
  }
};

TEST_P(TransportTest, GathersHeaderAndPayloadAndPreservesOrder) {
  auto a = Make();
  auto b = Make();
  std::vector<std::vector<uint8_t>> payloads;
  std::vector<uint8_t> header = {1, 2, 3, 4};
  std::vector<OutMessage> msgs;
  // Up to 9000 bytes, or what the datagram takes (RDMA: the port's MTU).
  const size_t most = std::min<size_t>(9000, a->max_datagram() - header.size());
  for (size_t i = 0; i < 200; ++i) payloads.emplace_back(1 + i * 37 % most, static_cast<uint8_t>(i));
  for (auto& p : payloads) msgs.push_back({b->local_address(), 1, header.data(), header.size(), p.data(), p.size()});
  ASSERT_TRUE(a->Send(msgs, MonotonicNow() + absl::Seconds(5)).ok());
  Address from;
  auto got = Collect(b.get(), msgs.size(), &from);
  ASSERT_EQ(got.size(), msgs.size());
  // From the sender's address, or (UDP path spraying) one of its other source ports.
  std::vector<uint16_t> sources;
  for (const Address& s : a->spray_sources()) sources.push_back(s.port);
  sources.push_back(a->local_address().port);
  EXPECT_EQ(from.ipv4, a->local_address().ipv4);
  EXPECT_NE(std::find(sources.begin(), sources.end(), from.port), sources.end()) << from.ToString();
  // Over RDMA the sender is its queue pair.
  if (GetParam().kind == TransportOptions::Kind::kRdma) {
    EXPECT_EQ(from, a->local_address()) << from.ToString();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].size(), 4 + payloads[i].size());
    EXPECT_EQ(got[i][3], 4);
    EXPECT_EQ(got[i].back(), static_cast<uint8_t>(i));
  }
  EXPECT_EQ(a->counters().sent_packets.load(), 200u);
  EXPECT_EQ(b->counters().recv_packets.load(), 200u);
  EXPECT_EQ(b->counters().rx_overflows.load(), 0u);
}

TEST_P(TransportTest, ReceiveReturnsAtMostOneBatch) {
  auto a = Make(64, /*offload=*/false);
  auto b = Make(/*batch=*/8, /*offload=*/false);
  uint8_t h[16] = {};
  std::vector<OutMessage> msgs(20, OutMessage{b->local_address(), 0, h, sizeof(h), nullptr, 0});
  ASSERT_TRUE(a->Send(msgs, MonotonicNow() + absl::Seconds(5)).ok());
  std::vector<InMessage> batch;
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(b->Receive(&batch, absl::Seconds(1)).ok());
  EXPECT_GE(batch.size(), 1u);
  EXPECT_LE(batch.size(), 8u);
  EXPECT_EQ(Collect(b.get(), 20 - batch.size()).size(), 20 - batch.size());
}

// Runs of equal-size datagrams to one peer go out as GSO super-datagrams and may come back
// coalesced by GRO; either way the receiver must see each datagram whole, once, in order.
TEST_P(TransportTest, EqualSizeRunsArriveAsSeparateDatagrams) {
  for (bool offload : {true, false}) {
    auto a = Make(64, offload);
    auto b = Make(64, offload);
    std::vector<std::vector<uint8_t>> payloads;
    std::vector<uint8_t> headers(300 * 4);
    std::vector<OutMessage> msgs;
    for (size_t i = 0; i < 300; ++i) {
      // Runs of 99 equal, then one shorter; within the port's MTU over RDMA.
      const size_t full = std::min<size_t>(1000, a->max_datagram() - 4);
      size_t len = (i % 100 == 99) ? full / 3 : full;
      payloads.emplace_back(len, static_cast<uint8_t>(i * 7));
      headers[i * 4] = static_cast<uint8_t>(i);
      headers[i * 4 + 1] = static_cast<uint8_t>(i >> 8);
    }
    for (size_t i = 0; i < 300; ++i) {
      msgs.push_back({b->local_address(), 2, &headers[i * 4], 4, payloads[i].data(), payloads[i].size()});
    }
    ASSERT_TRUE(a->Send(msgs, MonotonicNow() + absl::Seconds(5)).ok());
    auto got = Collect(b.get(), msgs.size());
    ASSERT_EQ(got.size(), msgs.size()) << "offload=" << offload;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].size(), 4 + payloads[i].size()) << i;
      ASSERT_EQ(got[i][0] | (got[i][1] << 8), static_cast<int>(i));
      ASSERT_EQ(got[i].back(), static_cast<uint8_t>(i * 7));
    }
    EXPECT_EQ(a->counters().sent_packets.load(), 300u);
    EXPECT_EQ(b->counters().recv_packets.load(), 300u);
    if (GetParam().kind == TransportOptions::Kind::kUdp && offload) {
      EXPECT_GT(a->OwnCounter("gso_sends"), 0u) << "GSO never used";
    } else {
      EXPECT_EQ(a->OwnCounter("gso_sends"), 0u);
    }
  }
}

// An odd-sized datagram (a manifest) followed by a shorter push to the same peer: every datagram
// must start 4-byte aligned on arrival, so a float payload after its 48-byte header can be read.
TEST_P(TransportTest, DatagramsArriveFourByteAlignedAfterOddSizedOnes) {
  auto a = Make();
  auto b = Make();
  std::vector<uint8_t> odd(73, 1), shorter(60, 2), header(4, 0);
  std::vector<OutMessage> msgs;
  for (int i = 0; i < 8; ++i) {
    msgs.push_back({b->local_address(), 0, header.data(), 0, odd.data(), odd.size()});
    msgs.push_back({b->local_address(), 0, header.data(), 0, shorter.data(), shorter.size()});
  }
  ASSERT_TRUE(a->Send(msgs, MonotonicNow() + absl::Seconds(5)).ok());
  std::vector<InMessage> batch;
  size_t got = 0;
  const absl::Time deadline = MonotonicNow() + absl::Seconds(5);
  while (got < msgs.size() && MonotonicNow() < deadline) {
    ASSERT_TRUE(b->Receive(&batch, absl::Milliseconds(100)).ok());
    for (const InMessage& m : batch) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(m.data) % 4, 0u) << "datagram " << got << " of " << m.len << " bytes";
      ++got;
    }
  }
  EXPECT_EQ(got, msgs.size());
}

TEST_P(TransportTest, ReceiveHonoursItsTimeout) {
  auto a = Make();
  std::vector<InMessage> batch;
  absl::Time start = MonotonicNow();
  ASSERT_TRUE(a->Receive(&batch, absl::Milliseconds(100)).ok());
  absl::Duration took = MonotonicNow() - start;
  EXPECT_TRUE(batch.empty());
  EXPECT_GE(took, absl::Milliseconds(95));
  EXPECT_LT(took, absl::Seconds(2));
}

TEST_P(TransportTest, WakeInterruptsABlockedReceive) {
  auto a = Make();
  std::thread waker([&] {
    absl::SleepFor(absl::Milliseconds(50));
    a->Wake();
  });
  std::vector<InMessage> batch;
  absl::Time start = MonotonicNow();
  ASSERT_TRUE(a->Receive(&batch, absl::Seconds(10)).ok());
  waker.join();
  EXPECT_LT(MonotonicNow() - start, absl::Seconds(5));
}

TEST_P(TransportTest, RejectsOversizeDatagrams) {
  auto a = Make();
  std::vector<uint8_t> big(70000);
  OutMessage m{a->local_address(), 0, big.data(), 48, big.data(), 65500};
  absl::Status s = a->Send({&m, 1}, MonotonicNow() + absl::Seconds(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
}

TEST_P(TransportTest, SendToAClosedPortIsNotAnError) {
  auto a = Make();
  Address gone;
  {
    auto b = Make();
    gone = b->local_address();
  }
  uint8_t h[8] = {};
  OutMessage m{gone, 0, h, sizeof(h), nullptr, 0};
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(a->Send({&m, 1}, MonotonicNow() + absl::Seconds(1)).ok());
}

INSTANTIATE_TEST_SUITE_P(Kinds, TransportTest,
                         ::testing::Values(TransportCase{TransportOptions::Kind::kLoopback, "127.0.0.1", "loopback"},
                                           TransportCase{TransportOptions::Kind::kUdp, "127.0.0.1", "udp"},
                                           TransportCase{TransportOptions::Kind::kUdp, "::1", "udp_ipv6"}
#if DLCP_WITH_RDMA
                                           ,
                                           TransportCase{TransportOptions::Kind::kRdma, "0.0.0.0", "rdma"}
#endif
                                           ),
                         [](const auto& info) { return info.param.name; });

TEST(TransportFactory, ValidatesOptions) {
  TransportOptions o;
  o.max_datagram = 70000;
  EXPECT_EQ(CreateTransport(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = TransportOptions();
  o.dscp[2] = 64;
  EXPECT_EQ(CreateTransport(o).status().code(), absl::StatusCode::kInvalidArgument);
  o = TransportOptions();
  o.bind_host = "no.such.host.invalid";
  EXPECT_FALSE(CreateTransport(o).ok());
  EXPECT_FALSE(ParseTransportKind("carrier-pigeon").ok());
  for (auto [ports, burst] : {std::pair{0u, 8u}, {65u, 8u}, {16u, 65u}}) {
    o = TransportOptions();
    o.spray_ports = ports;
    o.spray_burst = burst;
    absl::Status s = CreateTransport(o).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << ports << "/" << burst;
    EXPECT_NE(s.message().find(absl::StrCat("spray_ports ", ports)), std::string_view::npos) << s;
    EXPECT_NE(s.message().find(absl::StrCat("spray_burst ", burst)), std::string_view::npos) << s;
  }
}

// Each message's class must leave the host as its DSCP code point, including runs sent as one
// GSO super-datagram: the TOS byte over IPv4, the traffic class over IPv6. A plain socket with
// IP_RECVTOS (IPV6_RECVTCLASS) reads it from every datagram.
void ExpectEveryDatagramMarkedWithItsClassDscp(const std::string& host) {
  SCOPED_TRACE(host);
  absl::StatusOr<Address> at = ResolveAddress(host, 0);
  ASSERT_TRUE(at.ok()) << at.status();
  const bool v6 = at->v6;
  int rx = socket(at->family(), SOCK_DGRAM, 0);
  ASSERT_GE(rx, 0);
  int one = 1;
  ASSERT_EQ(v6 ? setsockopt(rx, IPPROTO_IPV6, IPV6_RECVTCLASS, &one, sizeof(one))
               : setsockopt(rx, IPPROTO_IP, IP_RECVTOS, &one, sizeof(one)),
            0);
  SockAddr sa = at->ToSockaddr();
  ASSERT_EQ(bind(rx, sa.get(), sa.len), 0);
  sa.len = sizeof(sa.storage);
  getsockname(rx, sa.get(), &sa.len);
  timeval tv{5, 0};
  setsockopt(rx, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));

  TransportOptions o;
  o.bind_host = host;
  o.dscp = {46, 34, 18, 8};
  auto tx = CreateTransport(o);
  ASSERT_TRUE(tx.ok()) << tx.status();
  Address to = Address::FromSockaddr(sa.get());
  std::vector<uint8_t> payload(100, 0);
  uint8_t headers[12];
  std::vector<OutMessage> msgs;
  for (int i = 0; i < 12; ++i) {
    headers[i] = static_cast<uint8_t>(i / 3);  // three in a row per class: GSO runs
    msgs.push_back({to, static_cast<uint8_t>(i / 3), &headers[i], 1, payload.data(), payload.size()});
  }
  ASSERT_TRUE((*tx)->Send(msgs, MonotonicNow() + absl::Seconds(2)).ok());
  for (int i = 0; i < 12; ++i) {
    uint8_t buf[2048];
    alignas(cmsghdr) uint8_t control[64];
    iovec iov{buf, sizeof(buf)};
    msghdr h{};
    h.msg_iov = &iov;
    h.msg_iovlen = 1;
    h.msg_control = control;
    h.msg_controllen = sizeof(control);
    ssize_t n = recvmsg(rx, &h, 0);
    ASSERT_EQ(n, 101) << "datagram " << i;
    int tos = -1;
    for (cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr; c = CMSG_NXTHDR(&h, c)) {
      if ((c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS) ||
          (c->cmsg_level == IPPROTO_IPV6 && c->cmsg_type == IPV6_TCLASS)) {
        tos = *CMSG_DATA(c);
      }
    }
    const uint8_t cls = buf[0];
    ASSERT_LT(cls, 4);
    EXPECT_EQ(tos >> 2, o.dscp[cls]) << "class " << int(cls);
  }
  close(rx);
}

TEST(UdpTransport, MarksEveryDatagramWithItsClassDscp) { ExpectEveryDatagramMarkedWithItsClassDscp("127.0.0.1"); }

TEST(UdpTransport, MarksEveryDatagramWithItsClassDscpOverIpv6) {
  if (!testing::HasIpv6Loopback()) GTEST_SKIP() << testing::kNoIpv6;
  ExpectEveryDatagramMarkedWithItsClassDscp("::1");
}

// A job's peers share one family: an IPv4 endpoint refuses an IPv6 peer, naming both, and the
// other way round, rather than failing in the kernel.
TEST(UdpTransport, RefusesAPeerOfTheOtherFamily) {
  if (!testing::HasIpv6Loopback()) GTEST_SKIP() << testing::kNoIpv6;
  TransportOptions o;
  o.bind_host = "127.0.0.1";
  auto v4 = CreateTransport(o);
  ASSERT_TRUE(v4.ok()) << v4.status();
  o.bind_host = "::1";
  auto v6 = CreateTransport(o);
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_TRUE((*v6)->local_address().v6);
  EXPECT_EQ((*v6)->local_address().HostString(), "::1");
  uint8_t h[8] = {};
  for (auto [from, to] : {std::pair{v4->get(), v6->get()}, std::pair{v6->get(), v4->get()}}) {
    OutMessage m{to->local_address(), 0, h, sizeof(h), nullptr, 0};
    absl::Status s = from->Send({&m, 1}, MonotonicNow() + absl::Seconds(1));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(to->local_address().ToString()), std::string_view::npos) << s;
    EXPECT_NE(s.message().find("one family"), std::string_view::npos) << s;
    EXPECT_EQ(from->counters().sent_packets.load(), 0u);
  }
}

// A wildcard bind is reached through loopback by peers on this host, in its own family.
TEST(UdpTransport, AWildcardBindReportsLoopbackOfItsFamily) {
  TransportOptions o;
  o.bind_host = "0.0.0.0";
  auto v4 = CreateTransport(o);
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ((*v4)->local_address().HostString(), "127.0.0.1");
  if (!testing::HasIpv6Loopback()) GTEST_SKIP() << testing::kNoIpv6;
  o.bind_host = "::";
  auto v6 = CreateTransport(o);
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ((*v6)->local_address().HostString(), "::1");
}

// A UDP sender spraying over `ports` source ports in bursts of `burst`, and a receiver on one
// port that takes datagrams one by one (no GRO), so they can be counted.
void SprayPair(bool gso, uint32_t ports, uint32_t burst, std::unique_ptr<Transport>* a, std::unique_ptr<Transport>* b,
               const std::string& host = "127.0.0.1") {
  TransportOptions o;
  o.kind = TransportOptions::Kind::kUdp;
  o.bind_host = host;
  o.udp.gso = o.udp.gro = gso;
  o.spray_ports = ports;
  o.spray_burst = burst;
  auto sender = CreateTransport(o);
  ASSERT_TRUE(sender.ok()) << sender.status();
  o.spray_ports = 1;
  o.udp.gro = false;
  auto receiver = CreateTransport(o);
  ASSERT_TRUE(receiver.ok()) << receiver.status();
  *a = std::move(*sender);
  *b = std::move(*receiver);
}

// A receive buffer that overflows loses datagrams on this host, not on the path: the transport
// counts them from the kernel's own count, which rides on the next datagram delivered.
TEST(UdpTransport, CountsTheDatagramsItsFullReceiveBufferDropped) {
  TransportOptions o;
  o.bind_host = "127.0.0.1";
  o.socket_buffer_bytes = 64 << 10;
  auto rx = CreateTransport(o);
  ASSERT_TRUE(rx.ok()) << rx.status();
  int tx = socket(AF_INET, SOCK_DGRAM, 0);
  ASSERT_GE(tx, 0);
  const SockAddr to = (*rx)->local_address().ToSockaddr();
  const std::vector<uint8_t> datagram(1000, 7);
  const auto send_one = [&] { return sendto(tx, datagram.data(), datagram.size(), 0, to.get(), to.len); };
  constexpr int kBurst = 400;  // about 0.8 MB against a 128 KiB buffer (the kernel doubles it)
  for (int i = 0; i < kBurst; ++i) ASSERT_EQ(send_one(), static_cast<ssize_t>(datagram.size()));
  std::vector<InMessage> batch;
  uint64_t received = 0;
  const absl::Time deadline = MonotonicNow() + absl::Seconds(5);
  do {  // until the buffer is empty
    ASSERT_TRUE((*rx)->Receive(&batch, absl::Milliseconds(100)).ok());
    received += batch.size();
  } while (!batch.empty() && MonotonicNow() < deadline);
  ASSERT_LT(received, static_cast<uint64_t>(kBurst)) << "nothing overflowed: the test needs a smaller buffer";
  // The datagram after the burst carries the kernel's count of what it dropped.
  ASSERT_EQ(send_one(), static_cast<ssize_t>(datagram.size()));
  ::testing::internal::CaptureStderr();
  do {
    ASSERT_TRUE((*rx)->Receive(&batch, absl::Milliseconds(100)).ok());
    received += batch.size();
  } while (batch.empty() && MonotonicNow() < deadline);
  const std::string log = ::testing::internal::GetCapturedStderr();
  close(tx);
  EXPECT_EQ((*rx)->counters().recv_packets.load(), received);
  EXPECT_EQ((*rx)->counters().rx_overflows.load(), kBurst + 1 - received);
  // Nothing else names host loss, so the transport warns, once, with the count and the cure.
  EXPECT_NE(log.find(absl::StrCat("dropped ", kBurst + 1 - received, " datagrams in all for UDP port ",
                                  (*rx)->local_address().port)),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("net.core.rmem_max"), std::string::npos) << log;
  EXPECT_EQ(log.find("dropped", log.find("dropped") + 1), std::string::npos) << "one warning: " << log;
}

// Path spraying: bursts of spray_burst datagrams leave from each of spray_ports source ports in
// turn, and the ports are the ones the transport reports (peers map them to the endpoint).
void ExpectBurstsSprayedOverEverySourcePort(const std::string& host) {
  SCOPED_TRACE(host);
  for (bool gso : {false, true}) {
    std::unique_ptr<Transport> a, b;
    ASSERT_NO_FATAL_FAILURE(SprayPair(gso, 4, 3, &a, &b, host));
    std::vector<uint16_t> ports;
    for (const Address& s : a->spray_sources()) {
      EXPECT_EQ(s.HostString(), a->local_address().HostString());
      ports.push_back(s.port);
    }
    ASSERT_EQ(ports.size(), 3u);
    ports.push_back(a->local_address().port);
    EXPECT_TRUE(b->spray_sources().empty());

    std::vector<uint8_t> payload(1000, 7);
    std::vector<OutMessage> msgs(60, OutMessage{b->local_address(), 1, payload.data(), payload.size()});
    ASSERT_TRUE(a->Send(msgs, MonotonicNow() + absl::Seconds(5)).ok());
    std::map<uint16_t, int> per_port;
    std::vector<uint16_t> order;
    std::vector<InMessage> batch;
    const absl::Time deadline = MonotonicNow() + absl::Seconds(5);
    while (order.size() < msgs.size() && MonotonicNow() < deadline) {
      ASSERT_TRUE(b->Receive(&batch, absl::Milliseconds(100)).ok());
      for (const InMessage& m : batch) {
        EXPECT_EQ(m.from.HostString(), host);
        ++per_port[m.from.port];
        order.push_back(m.from.port);
      }
    }
    ASSERT_EQ(order.size(), msgs.size()) << "gso " << gso;
    ASSERT_EQ(per_port.size(), 4u) << "gso " << gso;
    for (uint16_t p : ports) EXPECT_EQ(per_port[p], 15) << "port " << p << ", gso " << gso;
    // No run from one port is longer than a burst.
    size_t run = 1;
    for (size_t i = 1; i < order.size(); ++i) {
      run = order[i] == order[i - 1] ? run + 1 : 1;
      ASSERT_LE(run, 3u) << "at datagram " << i << ", gso " << gso;
    }
    EXPECT_EQ(a->counters().spray_bursts.load(), 20u);
    // Each path counts what left from it: path 0 is the bound port, the spray ports follow.
    for (size_t p = 0; p < 4; ++p) EXPECT_EQ(a->counters().path_packets[p].load(), 15u) << "path " << p;
    EXPECT_EQ(a->counters().path_packets[4].load(), 0u);
  }
}

TEST(UdpTransport, SpraysBurstsOverEverySourcePort) { ExpectBurstsSprayedOverEverySourcePort("127.0.0.1"); }

TEST(UdpTransport, SpraysBurstsOverEverySourcePortOverIpv6) {
  if (!testing::HasIpv6Loopback()) GTEST_SKIP() << testing::kNoIpv6;
  ExpectBurstsSprayedOverEverySourcePort("::1");
}

TEST(TransportOptions, TheDefaultSprayBurstIsShorterForJumboDatagrams) {
  TransportOptions o;
  EXPECT_EQ(o.spray_burst, 0u);
  EXPECT_EQ(o.SprayBurstFor(1400 + 48), 8u);  // MTU 1500
  EXPECT_EQ(o.SprayBurstFor(4096), 8u);       // RoCE's largest MTU
  EXPECT_EQ(o.SprayBurstFor(4097), 4u);
  EXPECT_EQ(o.SprayBurstFor(8192 + 48), 4u);  // MTU 9000
  o.spray_burst = 6;
  EXPECT_EQ(o.SprayBurstFor(1448), 6u);
  EXPECT_EQ(o.SprayBurstFor(8240), 6u);
}

// With the default burst, each port's run is 8 datagrams of 1,000 bytes, or 4 of 5,000 (larger
// than 4 KiB, as with jumbo frames).
TEST(UdpTransport, SpraysShorterBurstsOfJumboDatagramsByDefault) {
  for (bool gso : {false, true}) {
    std::unique_ptr<Transport> a, b;
    ASSERT_NO_FATAL_FAILURE(SprayPair(gso, 4, 0, &a, &b));
    std::vector<uint8_t> small(1000, 1), large(5000, 2);
    std::vector<OutMessage> msgs(32, OutMessage{b->local_address(), 1, small.data(), small.size()});
    msgs.resize(64, OutMessage{b->local_address(), 1, large.data(), large.size()});
    ASSERT_TRUE(a->Send(msgs, MonotonicNow() + absl::Seconds(5)).ok());
    std::vector<std::pair<uint16_t, size_t>> order;  // source port, length
    std::vector<InMessage> batch;
    const absl::Time deadline = MonotonicNow() + absl::Seconds(5);
    while (order.size() < msgs.size() && MonotonicNow() < deadline) {
      ASSERT_TRUE(b->Receive(&batch, absl::Milliseconds(100)).ok());
      for (const InMessage& m : batch) order.emplace_back(m.from.port, m.len);
    }
    ASSERT_EQ(order.size(), msgs.size()) << "gso " << gso;
    std::vector<size_t> runs = {1};
    for (size_t i = 1; i < order.size(); ++i) {
      if (order[i].first == order[i - 1].first) {
        ++runs.back();
      } else {
        runs.push_back(1);
      }
    }
    EXPECT_EQ(runs, std::vector<size_t>({8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4, 4})) << "gso " << gso;
    EXPECT_EQ(a->counters().spray_bursts.load(), 12u) << "gso " << gso;
  }
}

// A message that names its path leaves from that port (send_paths() of them: the bound port
// first, then spray_sources()), however long the run, with GSO or without.
TEST(UdpTransport, AMessageLeavesFromThePathItNames) {
  for (bool gso : {false, true}) {
    std::unique_ptr<Transport> a, b;
    ASSERT_NO_FATAL_FAILURE(SprayPair(gso, 4, 2, &a, &b));
    ASSERT_EQ(a->send_paths(), 4u);
    EXPECT_EQ(b->send_paths(), 1u);
    std::vector<uint16_t> port_of_path = {a->local_address().port};
    for (const Address& s : a->spray_sources()) port_of_path.push_back(s.port);

    // Path 2 ten times (longer than a burst), then 0, 3, 3, 1; the payload says which.
    const std::vector<int16_t> paths = {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 0, 3, 3, 1};
    std::vector<std::vector<uint8_t>> payloads;
    for (int16_t p : paths) payloads.push_back(std::vector<uint8_t>(1000, static_cast<uint8_t>(p)));
    std::vector<OutMessage> msgs;
    for (size_t i = 0; i < paths.size(); ++i) {
      OutMessage m{b->local_address(), 1, payloads[i].data(), payloads[i].size()};
      m.path = paths[i];
      msgs.push_back(m);
    }
    ASSERT_TRUE(a->Send(msgs, MonotonicNow() + absl::Seconds(5)).ok());
    size_t got = 0;
    std::vector<InMessage> batch;
    const absl::Time deadline = MonotonicNow() + absl::Seconds(5);
    while (got < msgs.size() && MonotonicNow() < deadline) {
      ASSERT_TRUE(b->Receive(&batch, absl::Milliseconds(100)).ok());
      for (const InMessage& m : batch) {
        ASSERT_EQ(m.len, 1000u);
        EXPECT_EQ(m.from.port, port_of_path[m.data[0]]) << "path " << int{m.data[0]} << ", gso " << gso;
        ++got;
      }
    }
    EXPECT_EQ(got, msgs.size()) << "gso " << gso;
    EXPECT_EQ(a->counters().spray_bursts.load(), 4u) << "gso " << gso;  // runs: 2, 0, 3, 1
    const std::vector<uint64_t> per_path = {1, 1, 10, 2};
    for (size_t p = 0; p < per_path.size(); ++p) {
      EXPECT_EQ(a->counters().path_packets[p].load(), per_path[p]) << "path " << p << ", gso " << gso;
    }
  }
}

// Only an RDMA port has counters of its own (port_counters.h).
TEST(UdpTransport, HasNoPortCounters) {
  TransportOptions o;
  o.kind = TransportOptions::Kind::kUdp;
  o.bind_host = "127.0.0.1";
  auto t = CreateTransport(o);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->port_counters(), nullptr);
}

TEST(UdpTransport, OneSprayPortSendsEverythingFromTheBoundPort) {
  TransportOptions o;
  o.kind = TransportOptions::Kind::kUdp;
  o.bind_host = "127.0.0.1";
  o.spray_ports = 1;
  auto a = CreateTransport(o);
  auto b = CreateTransport(o);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<uint8_t> payload(100, 1);
  std::vector<OutMessage> msgs(40, OutMessage{(*b)->local_address(), 2, payload.data(), payload.size()});
  ASSERT_TRUE((*a)->Send(msgs, MonotonicNow() + absl::Seconds(5)).ok());
  size_t got = 0;
  std::vector<InMessage> batch;
  const absl::Time deadline = MonotonicNow() + absl::Seconds(5);
  while (got < msgs.size() && MonotonicNow() < deadline) {
    ASSERT_TRUE((*b)->Receive(&batch, absl::Milliseconds(100)).ok());
    for (const InMessage& m : batch) {
      EXPECT_EQ(m.from, (*a)->local_address());
      ++got;
    }
  }
  EXPECT_EQ(got, msgs.size());
  EXPECT_EQ((*a)->counters().spray_bursts.load(), 0u);
  EXPECT_EQ((*a)->counters().path_packets[0].load(), 40u);
  EXPECT_EQ((*a)->counters().path_packets[1].load(), 0u);
}

}  // namespace
}  // namespace dlcp
