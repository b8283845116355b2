// Data-plane addresses of both families: parsing, printing, socket addresses, resolution with a
// family, hashing, and the lock-free slot dlcpd's data threads read members' addresses from.
#include <gtest/gtest.h>

#include <arpa/inet.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "common/base/host_port.h"
#include "common/transport/address.h"
#include "common/transport/atomic_address.h"
#include "common/rpc/grpc_peer.h"

namespace dlcp {
namespace {

Address V6Literal(const char* text, uint16_t port) {
  std::array<uint8_t, 16> ip{};
  EXPECT_EQ(inet_pton(AF_INET6, text, ip.data()), 1) << text;
  return Address::V6(ip, port);
}

TEST(HostPort, SplitsBracketedIpv6HostsAndRefusesBareOnes) {
  auto hp = SplitHostPort("[::1]:7000");
  ASSERT_TRUE(hp.ok()) << hp.status();
  EXPECT_EQ(hp->first, "::1");
  EXPECT_EQ(hp->second, 7000);
  hp = SplitHostPort("[fd00::a:2]:0");
  ASSERT_TRUE(hp.ok()) << hp.status();
  EXPECT_EQ(hp->first, "fd00::a:2");
  hp = SplitHostPort("10.0.0.1:65535");
  ASSERT_TRUE(hp.ok()) << hp.status();
  EXPECT_EQ(hp->first, "10.0.0.1");
  EXPECT_EQ(hp->second, 65535);
  // "::1:7000" could be host ::1 port 7000, or host ::1:7000 with no port.
  absl::Status s = SplitHostPort("::1:7000").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("[::1]:7000"), std::string_view::npos) << s;
  for (const char* bad : {"[::1]", "[]:1", "[::1:7000", "::1]:7000", "[[::1]]:7", "[::1]x:7", ":7", "h:70000"}) {
    EXPECT_FALSE(SplitHostPort(bad).ok()) << bad;
  }
  EXPECT_EQ(JoinHostPort("::1", 7000), "[::1]:7000");
  EXPECT_EQ(JoinHostPort("10.0.0.1", 7), "10.0.0.1:7");
  EXPECT_EQ(JoinHostPort("node-3", 7), "node-3:7");
}

TEST(Address, PrintsAndConvertsBothFamilies) {
  const Address v4{0x0a000001, 5000};
  EXPECT_EQ(v4.ToString(), "10.0.0.1:5000");
  EXPECT_EQ(v4.family(), AF_INET);
  const Address v6 = V6Literal("fd00::1:2", 5000);
  EXPECT_EQ(v6.ToString(), "[fd00::1:2]:5000");
  EXPECT_EQ(v6.HostString(), "fd00::1:2");
  EXPECT_EQ(v6.family(), AF_INET6);
  EXPECT_FALSE(v6.wildcard());
  EXPECT_TRUE(V6Literal("::", 0).wildcard());
  EXPECT_TRUE((Address{0, 9}).wildcard());
  for (const Address& a : {v4, v6, V6Literal("::1", 1), Address{0xffffffff, 65535}}) {
    const SockAddr sa = a.ToSockaddr();
    EXPECT_EQ(sa.get()->sa_family, a.family());
    EXPECT_EQ(sa.len, a.v6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in));
    EXPECT_EQ(Address::FromSockaddr(sa.get()), a) << a.ToString();
  }
  // A dual-stack socket reports IPv4 peers as ::ffff:a.b.c.d: they are IPv4 addresses.
  const Address mapped = Address::FromSockaddr(V6Literal("::ffff:10.0.0.1", 5000).ToSockaddr().get());
  EXPECT_EQ(mapped, v4);
  sockaddr_storage unix_like{};
  unix_like.ss_family = AF_UNIX;
  EXPECT_EQ(Address::FromSockaddr(reinterpret_cast<sockaddr*>(&unix_like)), Address{});
}

TEST(Address, HashesAndOrdersAddressesOfBothFamiliesApart) {
  const std::vector<Address> all = {Address{0x0a000001, 7},      Address{0x0a000001, 8},     Address{0x0a000001, 0, 7},
                                    Address{0x0a000002, 7},      V6Literal("::1", 7),        V6Literal("::1", 8),
                                    V6Literal("fd00::1", 7),     V6Literal("::", 0),         Address{}};
  absl::flat_hash_set<Address> set(all.begin(), all.end());
  EXPECT_EQ(set.size(), all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    for (size_t j = 0; j < all.size(); ++j) {
      EXPECT_EQ(all[i] == all[j], i == j) << all[i].ToString() << " " << all[j].ToString();
      if (i != j) {
        EXPECT_NE(all[i] < all[j], all[j] < all[i]) << all[i].ToString() << " " << all[j].ToString();
      }
    }
  }
  // ::a.b.c.d is not the IPv4 address a.b.c.d.
  EXPECT_NE(V6Literal("::10.0.0.1", 7), (Address{0x0a000001, 7}));
}

TEST(Address, ResolvesInTheFamilyAskedForAndSaysWhenTheHostHasNone) {
  auto a = ResolveAddress("::1", 9);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, V6Literal("::1", 9));
  a = ResolveAddress("127.0.0.1", 9, AF_INET);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, (Address{0x7f000001, 9}));
  a = ResolveAddress("::1", 9, AF_INET6);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(a->v6);
  a = ResolveHostPort("[fd00::7]:12", AF_INET6);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, V6Literal("fd00::7", 12));
  // A peer of the other family: the error names the host and both families.
  absl::Status s = ResolveAddress("127.0.0.1", 9, AF_INET6).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'127.0.0.1' has no IPv6 address (it is IPv4)"), std::string_view::npos) << s;
  s = ResolveAddress("::1", 9, AF_INET).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'::1' has no IPv4 address (it is IPv6)"), std::string_view::npos) << s;
  EXPECT_EQ(ResolveAddress("no.such.host.invalid", 9).status().code(), absl::StatusCode::kNotFound);
}

TEST(PeerHost, ReadsGrpcPeersOfBothFamilies) {
  EXPECT_EQ(PeerHost("ipv4:10.0.0.1:5000"), "10.0.0.1");
  EXPECT_EQ(PeerHost("ipv6:%5B::1%5D:5000"), "::1");
  EXPECT_EQ(PeerHost("ipv6:[fd00::2]:5000"), "fd00::2");
  EXPECT_EQ(PeerHost("unix:/tmp/s"), "");
  EXPECT_EQ(PeerHost("ipv6:::1:5000"), "");  // unbracketed: no telling host from port
  EXPECT_EQ(PeerHostPort("ipv4:10.0.0.1:5000"), std::make_pair(std::string("10.0.0.1"), uint16_t{5000}));
  EXPECT_EQ(PeerHostPort("unix:/tmp/s"), std::nullopt);
}

TEST(AtomicAddress, ExchangesAndClears) {
  AtomicAddress slot;
  EXPECT_FALSE(slot.Load().has_value());
  const Address v6 = V6Literal("fd00::1", 7);
  EXPECT_FALSE(slot.Exchange(v6).has_value());
  EXPECT_EQ(slot.Load(), v6);
  EXPECT_EQ(slot.Exchange(Address{0x0a000001, 7}), v6);
  EXPECT_EQ(slot.Exchange(std::nullopt), (Address{0x0a000001, 7}));
  EXPECT_FALSE(slot.Load().has_value());
  // The wildcard is an address like any other, not "none".
  EXPECT_FALSE(slot.Exchange(Address{}).has_value());
  EXPECT_EQ(slot.Load(), Address{});
}

// Readers on other threads see one of the addresses written, never a mix of two.
TEST(AtomicAddress, ReadersNeverSeeATornAddress) {
  const Address a = V6Literal("fd00::1111:1111", 1111);
  const Address b = V6Literal("fd00::2222:2222", 2222);
  AtomicAddress slot;
  slot.Exchange(a);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0}, torn{0};
  std::vector<std::thread> readers;
  for (int i = 0; i < 2; ++i) {
    readers.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        const std::optional<Address> got = slot.Load();
        if (!got || (*got != a && *got != b)) torn.fetch_add(1);
        reads.fetch_add(1);
      }
    });
  }
  for (int i = 0; i < 20000; ++i) slot.Exchange(i % 2 ? a : b);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (reads.load() < 1000 && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  stop = true;
  for (auto& t : readers) t.join();
  EXPECT_GE(reads.load(), 1000u);
  EXPECT_EQ(torn.load(), 0u) << "of " << reads.load() << " reads";
}

}  // namespace
}  // namespace dlcp
