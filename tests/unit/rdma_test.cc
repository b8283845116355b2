// The RDMA transport. The GRH and address tests run everywhere; the rest need an RDMA device and
// skip with "no RDMA device" without one. tests/rdma-vm/ runs them against real verbs on
// Soft-RoCE (rdma_rxe) inside a VM.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "common/transport/atomic_address.h"
#include "common/transport/rdma/grh.h"
#include "common/transport/factory.h"
#include "common/transport/transport.h"

namespace dlcp {
namespace {

// ---- GRH parsing and addresses: no device needed.

std::array<uint8_t, 40> Ipv4Grh(uint32_t src, uint32_t dst, uint8_t tos) {
  std::array<uint8_t, 40> g{};
  std::fill(g.begin(), g.begin() + 20, 0xab);  // unspecified bytes: must not matter
  uint8_t* h = g.data() + 20;
  h[0] = 0x45;
  h[1] = tos;
  h[2] = 0, h[3] = 100;  // total length
  h[8] = 64;             // TTL
  h[9] = 17;             // UDP
  for (int i = 0; i < 4; ++i) {
    h[12 + i] = static_cast<uint8_t>(src >> (24 - 8 * i));
    h[16 + i] = static_cast<uint8_t>(dst >> (24 - 8 * i));
  }
  uint32_t sum = 0;
  for (int i = 0; i < 20; i += 2) sum += static_cast<uint32_t>(h[i]) << 8 | h[i + 1];
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  const uint16_t check = static_cast<uint16_t>(~sum);
  h[10] = static_cast<uint8_t>(check >> 8);
  h[11] = static_cast<uint8_t>(check);
  return g;
}

TEST(RdmaGrh, ReadsSourceAndDscpFromAnIpv4Header) {
  auto g = Ipv4Grh(0x0a000001, 0x0a000002, 34 << 2);
  std::optional<rdma::GrhSource> s = rdma::ParseGrh(g.data());
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->ipv4, 0x0a000001u);
  EXPECT_EQ(s->dscp, 34);
}

TEST(RdmaGrh, AcceptsAnUnchecksummedIpv4HeaderAfterZeroedBytes) {
  // What Soft-RoCE delivers for a packet whose checksum was left to offload.
  auto g = Ipv4Grh(0x0a000001, 0x0a000001, 46 << 2);
  std::fill(g.begin(), g.begin() + 20, 0);
  g[30] = g[31] = 0;
  std::optional<rdma::GrhSource> s = rdma::ParseGrh(g.data());
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->ipv4, 0x0a000001u);
  EXPECT_EQ(s->dscp, 46);
}

TEST(RdmaGrh, RejectsAnIpv4HeaderWithABadChecksum) {
  auto g = Ipv4Grh(0x0a000001, 0x0a000002, 46 << 2);
  g[20 + 10] ^= 1;
  g[0] = 0;  // and not an IPv6 header either
  EXPECT_FALSE(rdma::ParseGrh(g.data()).has_value());
}

TEST(RdmaGrh, ReadsAnIpv6HeaderFromAnIpv4MappedGid) {
  std::array<uint8_t, 40> g{};
  const int tclass = 18 << 2;
  g[0] = static_cast<uint8_t>(0x60 | tclass >> 4);
  g[1] = static_cast<uint8_t>((tclass & 0xf) << 4);
  rdma::Ipv4ToGid(0xc0a80107, g.data() + 8);
  rdma::Ipv4ToGid(0xc0a80108, g.data() + 24);
  std::optional<rdma::GrhSource> s = rdma::ParseGrh(g.data());
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->ipv4, 0xc0a80107u);
  EXPECT_EQ(s->dscp, 18);
  g[8] = 0xfe;  // a link-local IPv6 GID: not a dlcp peer
  EXPECT_FALSE(rdma::ParseGrh(g.data()).has_value());
}

TEST(RdmaGrh, GidsMapIpv4BothWays) {
  uint8_t gid[16];
  rdma::Ipv4ToGid(0x01020304, gid);
  const uint8_t want[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 1, 2, 3, 4};
  EXPECT_EQ(std::memcmp(gid, want, 16), 0);
  EXPECT_EQ(rdma::GidToIpv4(gid), 0x01020304u);
  gid[0] = 0xfe;
  EXPECT_FALSE(rdma::GidToIpv4(gid).has_value());
}

TEST(RdmaAddress, QueuePairAddressesStayApartFromPorts) {
  const Address udp{0xffffffff, 65535};
  const Address qp{0xffffffff, 0, 0xffffff};
  EXPECT_NE((Address{0x0a000001, 7}), (Address{0x0a000001, 0, 7}));
  // A member's address as the aggregator keeps it for its data threads.
  for (const Address& a : {udp, qp, Address{0x0a000001, 7}, Address{0x0a000001, 0, 7}}) {
    AtomicAddress slot;
    EXPECT_FALSE(slot.Exchange(a).has_value());
    EXPECT_EQ(slot.Load(), a) << a.ToString();
  }
  EXPECT_EQ((Address{0x0a000001, 0, 17}.ToString()), "10.0.0.1/qp17");
}

// ---- Availability: what auto does follows from what RDMA can do here.

TEST(RdmaAvailability, AutoPicksRdmaExactlyWhenADeviceIsUsable) {
  TransportOptions o;
  o.kind = TransportOptions::Kind::kRdma;
  absl::StatusOr<std::unique_ptr<Transport>> rdma = CreateTransport(o);
  o.kind = TransportOptions::Kind::kAuto;
  absl::StatusOr<std::unique_ptr<Transport>> any = CreateTransport(o);
  ASSERT_TRUE(any.ok()) << any.status();
  if (rdma.ok()) {
    EXPECT_EQ((*any)->kind(), TransportOptions::Kind::kRdma);
  } else {
    EXPECT_EQ((*any)->kind(), TransportOptions::Kind::kUdp);
    // The reason names what is missing.
    const std::string why(rdma.status().message());
    EXPECT_TRUE(why.find("no RDMA device") != std::string::npos || why.find("libibverbs") != std::string::npos ||
                why.find("not active") != std::string::npos || why.find("RoCEv2") != std::string::npos)
        << why;
  }
}

// ---- On a device.

class RdmaTransportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<Transport>> probe = Make();
    if (!probe.ok()) GTEST_SKIP() << "no RDMA device usable here: " << probe.status().message();
  }

  static absl::StatusOr<std::unique_ptr<Transport>> Make(RdmaOptions r = {}, uint32_t spray_ports = 16,
                                                        uint32_t spray_burst = 8) {
    TransportOptions o;
    o.kind = TransportOptions::Kind::kRdma;
    o.rdma = r;
    o.spray_ports = spray_ports;
    o.spray_burst = spray_burst;
    return CreateTransport(o);
  }

  // A 64-slot send ring, signalled every 16 sends: a few rounds of sends wrap it.
  static RdmaOptions SmallRing() {
    RdmaOptions r;
    r.send_slots = 64;
    r.signal_every = 16;
    return r;
  }

  static std::vector<std::vector<uint8_t>> Collect(Transport* t, size_t want, std::vector<InMessage>* meta = nullptr) {
    std::vector<std::vector<uint8_t>> got;
    std::vector<InMessage> batch;
    const absl::Time deadline = MonotonicNow() + absl::Seconds(20);
    while (got.size() < want && MonotonicNow() < deadline) {
      EXPECT_TRUE(t->Receive(&batch, absl::Milliseconds(200)).ok());
      for (const InMessage& m : batch) {
        got.emplace_back(m.data, m.data + m.len);
        if (meta) meta->push_back(InMessage{m.from, nullptr, m.len, m.dscp});
      }
    }
    return got;
  }
};

// The port's own counters come from sysfs (every driver names its own; Soft-RoCE counts packets
// as sent_pkts and rcvd_pkts). The kernel caches them for `lifespan` ms, so a count may lag.
TEST_F(RdmaTransportTest, ReadsThePortsOwnCounters) {
  auto a = *Make({}, 1);
  auto b = *Make({}, 1);
  ASSERT_NE(a->port_counters(), nullptr);
  const PortCounterSource& port = *a->port_counters();
  absl::StatusOr<std::vector<PortCounter>> before = port.ReadAll();
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_FALSE(before->empty());
  const auto sent_pkts = std::find_if(before->begin(), before->end(), [](const PortCounter& c) {
    return c.name == "sent_pkts";
  });
  std::vector<uint32_t> seq(300);
  std::vector<OutMessage> msgs;
  for (uint32_t& s : seq) msgs.push_back({b->local_address(), 2, reinterpret_cast<const uint8_t*>(&s), sizeof(s)});
  ASSERT_TRUE(a->Send(msgs, MonotonicNow() + absl::Seconds(5)).ok());
  ASSERT_EQ(Collect(b.get(), msgs.size()).size(), msgs.size());
  for (const PortCounter& c : *before) {  // counts only grow
    absl::StatusOr<uint64_t> now = port.Read(c.name);
    ASSERT_TRUE(now.ok()) << now.status();
    EXPECT_GE(*now, c.value) << c.name;
  }
  if (sent_pkts == before->end()) GTEST_SKIP() << "this driver has no sent_pkts counter";
  uint64_t sent = 0;
  for (const absl::Time deadline = MonotonicNow() + absl::Seconds(2); MonotonicNow() < deadline;) {
    sent = *port.Read("sent_pkts") - sent_pkts->value;
    if (sent >= msgs.size()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_GE(sent, msgs.size());
  EXPECT_EQ(port.Read("no_such_counter").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(RdmaTransportTest, WrapsTheSendRingAndRepostsReceivesInBatches) {
  RdmaOptions small;
  small.send_slots = 64;
  small.signal_every = 16;
  small.recv_slots = 256;
  auto a = *Make(small);
  auto b = *Make(small);
  // 20 bursts of 200: each burst wraps the 64-slot send ring three times and needs most of the
  // 256 receive buffers, which only come back if every burst's buffers are re-posted.
  uint32_t next = 0;
  for (int burst = 0; burst < 20; ++burst) {
    std::vector<uint32_t> seq(200);
    std::vector<OutMessage> msgs;
    for (uint32_t& s : seq) {
      s = next++;
      msgs.push_back({b->local_address(), 2, reinterpret_cast<const uint8_t*>(&s), sizeof(s)});
    }
    ASSERT_TRUE(a->Send(msgs, MonotonicNow() + absl::Seconds(5)).ok());
    auto got = Collect(b.get(), msgs.size());
    ASSERT_EQ(got.size(), msgs.size()) << "burst " << burst;
    for (size_t i = 0; i < got.size(); ++i) {
      uint32_t v;
      std::memcpy(&v, got[i].data(), sizeof(v));
      ASSERT_EQ(v, seq[i]);
    }
  }
  EXPECT_EQ(b->counters().dropped.load(), 0u);
  EXPECT_EQ(b->OwnCounter("rx_queue_empty"), 0u);
}

// A receiver that falls a whole queue behind: its 64 receive buffers take the first datagrams of
// a burst of 400 it does not read, and the NIC drops the rest without a count anywhere. The
// queue's limit event counts that it ran dry, and a warning names it. The queue serves on: a
// burst it has room for arrives whole and counts nothing, and falling behind again counts again
// (the event was armed again).
TEST_F(RdmaTransportTest, CountsAndNamesAReceiveQueueThatRanDry) {
  RdmaOptions few;
  few.recv_slots = 64;
  auto a = *Make(SmallRing(), 1);
  auto b = *Make(few, 1);
  uint32_t next = 0;
  // Sends n datagrams while b reads nothing, lets them land, then reads until 300 ms of quiet.
  const auto burst = [&](uint32_t n) {
    std::vector<uint32_t> seq(n);
    std::vector<OutMessage> msgs;
    for (uint32_t& s : seq) {
      s = next++;
      msgs.push_back({b->local_address(), 1, reinterpret_cast<const uint8_t*>(&s), sizeof(s)});
    }
    EXPECT_TRUE(a->Send(msgs, MonotonicNow() + absl::Seconds(5)).ok());
    absl::SleepFor(absl::Milliseconds(300));
    size_t got = 0;
    std::vector<InMessage> batch;
    const absl::Time deadline = MonotonicNow() + absl::Seconds(20);
    for (absl::Time quiet = MonotonicNow() + absl::Milliseconds(300); MonotonicNow() < quiet && MonotonicNow() < deadline;) {
      EXPECT_TRUE(b->Receive(&batch, absl::Milliseconds(50)).ok());
      if (!batch.empty()) quiet = MonotonicNow() + absl::Milliseconds(300);
      got += batch.size();
    }
    return got;
  };
  testing::internal::CaptureStderr();
  const size_t first = burst(400);
  const uint64_t dry = b->OwnCounter("rx_queue_empty");
  EXPECT_GE(first, 64u);
  EXPECT_LT(first, 400u) << "the queue held more than its 64 buffers";
  EXPECT_GE(dry, 1u) << first << " of 400 arrived";

  EXPECT_EQ(burst(50), 50u) << "the buffers were not all posted again";
  EXPECT_EQ(b->OwnCounter("rx_queue_empty"), dry);

  EXPECT_LT(burst(400), 400u);
  EXPECT_GT(b->OwnCounter("rx_queue_empty"), dry) << "the limit event was not armed again";
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("(64 buffers) ran dry, 1 time(s) in all"), std::string::npos) << log;
  EXPECT_NE(log.find("raise --rdma-recv-slots"), std::string::npos) << log;
  EXPECT_EQ(b->counters().dropped.load(), 0u);
}

// Path spraying over queue pairs: bursts leave from each queue pair in turn (the NIC derives the
// RoCEv2 source port from it), the receiver sees them as the transport reports them, and the
// shared send ring keeps working when completions come back per queue pair.
TEST_F(RdmaTransportTest, SpraysBurstsOverQueuePairs) {
  auto a = *Make(SmallRing(), 4, 3);
  auto b = *Make({}, 1);
  EXPECT_TRUE(b->spray_sources().empty());
  std::vector<uint32_t> qpns = {a->local_address().qpn};
  for (const Address& s : a->spray_sources()) {
    EXPECT_EQ(s.ipv4, a->local_address().ipv4);
    qpns.push_back(s.qpn);
  }
  ASSERT_EQ(qpns.size(), 4u);
  for (int round = 0; round < 5; ++round) {  // 5 x 60 sends through a 64-slot ring
    std::vector<uint32_t> body(60);
    std::vector<OutMessage> msgs;
    for (uint32_t i = 0; i < body.size(); ++i) {
      body[i] = i;
      msgs.push_back({b->local_address(), 1, reinterpret_cast<const uint8_t*>(&body[i]), sizeof(uint32_t)});
    }
    ASSERT_TRUE(a->Send(msgs, MonotonicNow() + absl::Seconds(5)).ok()) << "round " << round;
    std::vector<InMessage> meta;
    auto got = Collect(b.get(), msgs.size(), &meta);
    ASSERT_EQ(got.size(), msgs.size()) << "round " << round;
    std::map<uint32_t, int> per_qp;
    for (const InMessage& m : meta) {
      ASSERT_NE(std::find(qpns.begin(), qpns.end(), m.from.qpn), qpns.end()) << m.from.ToString();
      ++per_qp[m.from.qpn];
    }
    EXPECT_EQ(per_qp.size(), 4u) << "round " << round;
    for (auto [qpn, n] : per_qp) EXPECT_EQ(n, 15) << "qp " << qpn << ", round " << round;
  }
  EXPECT_EQ(a->counters().spray_bursts.load(), 100u);
}

// Path steering over RDMA: a message that names a path leaves from that queue pair (as a UDP one
// leaves from that source port), in runs of any length.
TEST_F(RdmaTransportTest, AMessageLeavesFromTheQueuePairItsPathNames) {
  auto a = *Make(SmallRing(), 4, 3);
  auto b = *Make({}, 1);
  ASSERT_EQ(a->send_paths(), 4u);
  EXPECT_EQ(b->send_paths(), 1u);
  std::vector<uint32_t> qpn_of_path = {a->local_address().qpn};
  for (const Address& s : a->spray_sources()) qpn_of_path.push_back(s.qpn);
  // Path 2 ten times (longer than a burst), then 0, 3, 3, 1; the payload says which. Three
  // rounds through a 64-slot ring, so that completions on every queue pair free it.
  const std::vector<int16_t> paths = {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 0, 3, 3, 1};
  for (int round = 0; round < 6; ++round) {
    std::vector<std::vector<uint8_t>> payloads;
    for (int16_t p : paths) payloads.push_back(std::vector<uint8_t>(200, static_cast<uint8_t>(p)));
    std::vector<OutMessage> msgs;
    for (size_t i = 0; i < paths.size(); ++i) {
      OutMessage m{b->local_address(), 1, payloads[i].data(), payloads[i].size()};
      m.path = paths[i];
      msgs.push_back(m);
    }
    ASSERT_TRUE(a->Send(msgs, MonotonicNow() + absl::Seconds(5)).ok()) << "round " << round;
    std::vector<InMessage> meta;
    auto got = Collect(b.get(), msgs.size(), &meta);
    ASSERT_EQ(got.size(), msgs.size()) << "round " << round;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(meta[i].from.qpn, qpn_of_path[got[i][0]]) << "path " << int{got[i][0]} << ", round " << round;
    }
  }
  // Runs 2, 0, 3, 1 per round; the first round's 2 follows nothing, every later one follows 1.
  EXPECT_EQ(a->counters().spray_bursts.load(), 24u);
  // Each queue pair counts what was posted on it, by its path index.
  const std::vector<uint64_t> per_path = {6, 6, 60, 12};
  for (size_t p = 0; p < per_path.size(); ++p) EXPECT_EQ(a->counters().path_packets[p].load(), per_path[p]) << "path " << p;
}

TEST_F(RdmaTransportTest, EachClassArrivesWithItsDscpInTheGrh) {
  auto a = *Make();
  auto b = *Make();
  const std::array<uint8_t, 4> dscp = TransportOptions{}.dscp;
  std::vector<OutMessage> msgs;
  const uint8_t body[4] = {0, 1, 2, 3};
  for (uint8_t c = 0; c < 4; ++c) msgs.push_back({b->local_address(), c, &body[c], 1});
  ASSERT_TRUE(a->Send(msgs, MonotonicNow() + absl::Seconds(5)).ok());
  std::vector<InMessage> meta;
  auto got = Collect(b.get(), 4, &meta);
  ASSERT_EQ(got.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    const uint8_t c = got[i][0];
    EXPECT_EQ(meta[i].dscp, dscp[c]) << "class " << int{c};
  }
}

TEST_F(RdmaTransportTest, RefusesDatagramsOverTheMtu) {
  auto a = *Make();
  std::vector<uint8_t> big(a->max_datagram() + 1);
  OutMessage m{a->local_address(), 0, big.data(), big.size()};
  absl::Status s = a->Send({&m, 1}, MonotonicNow() + absl::Seconds(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("MTU"), std::string_view::npos) << s;
}

TEST_F(RdmaTransportTest, BadSettingsGiveErrorsThatNameTheFix) {
  RdmaOptions o;
  o.device = "no-such-device";
  absl::StatusOr<std::unique_ptr<Transport>> t = Make(o);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("no RDMA device named 'no-such-device'"), std::string_view::npos) << t.status();

  o = RdmaOptions{};
  o.gid_index = 4000;
  t = Make(o);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("GID index 4000"), std::string_view::npos) << t.status();

  o = RdmaOptions{};
  o.qkey = 0x80000001;
  t = Make(o);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("privileged"), std::string_view::npos) << t.status();

  o = RdmaOptions{};
  o.signal_every = 7;
  t = Make(o);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("signal_every"), std::string_view::npos) << t.status();
}

}  // namespace
}  // namespace dlcp
