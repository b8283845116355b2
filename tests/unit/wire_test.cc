#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "common/wire/geometry.h"
#include "common/wire/header.h"
#include "common/wire/mac.h"
#include "common/wire/ranges.h"

namespace dlcp::wire {
namespace {

Header Sample() {
  Header h;
  h.type = MsgType::kPush;
  h.priority = 2;
  h.flags = 0;
  h.job = 0xDEADBEEF;
  h.key = 7;
  h.round = 123456;
  h.chunk = 3;
  h.chunk_count = 10;
  h.tensor_elems = 20000;
  h.rank = 513;
  h.contributors = 4;
  h.epoch = 9;
  h.payload_len = 16;
  return h;
}

std::vector<uint8_t> Datagram(const Header& h, size_t payload) {
  std::vector<uint8_t> d(kHeaderSize + payload, 0xAB);
  EncodeHeader(h, d.data());
  return d;
}

TEST(WireHeader, RoundTripsEveryField) {
  Header h = Sample();
  std::vector<uint8_t> d = Datagram(h, 16);
  Header out;
  ASSERT_EQ(ParseHeader(d, &out), Reject::kNone);
  EXPECT_EQ(out.type, h.type);
  EXPECT_EQ(out.priority, h.priority);
  EXPECT_EQ(out.job, h.job);
  EXPECT_EQ(out.key, h.key);
  EXPECT_EQ(out.round, h.round);
  EXPECT_EQ(out.chunk, h.chunk);
  EXPECT_EQ(out.chunk_count, h.chunk_count);
  EXPECT_EQ(out.tensor_elems, h.tensor_elems);
  EXPECT_EQ(out.rank, h.rank);
  EXPECT_EQ(out.contributors, h.contributors);
  EXPECT_EQ(out.epoch, h.epoch);
  EXPECT_EQ(out.payload_len, h.payload_len);
}

TEST(WireHeader, IsLittleEndianOnTheWire) {
  std::vector<uint8_t> d = Datagram(Sample(), 16);
  EXPECT_EQ(d[0], 'D');
  EXPECT_EQ(d[1], 'L');
  EXPECT_EQ(d[2], 'C');
  EXPECT_EQ(d[3], 'P');
  EXPECT_EQ(d[4], kVersion);
  // job 0xDEADBEEF at offset 8, least significant byte first
  EXPECT_EQ(d[8], 0xEF);
  EXPECT_EQ(d[11], 0xDE);
  // rank 513 at offset 32
  EXPECT_EQ(d[32], 0x01);
  EXPECT_EQ(d[33], 0x02);
}

TEST(WireHeader, RejectsMalformedInput) {
  Header out;
  std::vector<uint8_t> good = Datagram(Sample(), 16);
  EXPECT_EQ(ParseHeader(absl::MakeConstSpan(good.data(), 47), &out), Reject::kTruncated);
  EXPECT_EQ(ParseHeader({}, &out), Reject::kTruncated);

  auto mutate = [&](size_t at, uint8_t v) {
    std::vector<uint8_t> d = good;
    d[at] = v;
    return ParseHeader(d, &out);
  };
  EXPECT_EQ(mutate(0, 'X'), Reject::kBadMagic);
  EXPECT_EQ(mutate(4, 2), Reject::kBadVersion);
  EXPECT_EQ(mutate(5, 0), Reject::kBadType);
  EXPECT_EQ(mutate(5, 99), Reject::kBadType);
  EXPECT_EQ(mutate(6, 4), Reject::kBadClass);
  EXPECT_EQ(mutate(7, 0x80), Reject::kBadFlags);
  EXPECT_EQ(mutate(7, 0x10), Reject::kBadFlags);  // the lowest bit no flag has
  EXPECT_EQ(mutate(7, kFlagRepaired), Reject::kNone);
  EXPECT_EQ(out.flags, kFlagRepaired);
  EXPECT_EQ(mutate(45, 1), Reject::kReservedSet);
  EXPECT_EQ(mutate(47, 1), Reject::kReservedSet);
  EXPECT_EQ(mutate(44, 3), Reject::kBadEncoding);
  EXPECT_EQ(mutate(44, 1), Reject::kNone);  // float16: 16 bytes are 8 values
  EXPECT_EQ(mutate(40, 17), Reject::kLengthMismatch);  // payload_len lies (17 != 16)
  EXPECT_EQ(mutate(20, 10), Reject::kBadChunk);        // chunk == chunk_count

  std::vector<uint8_t> longer = good;
  longer.push_back(0);  // datagram longer than header says
  EXPECT_EQ(ParseHeader(longer, &out), Reject::kLengthMismatch);

  Header odd = Sample();
  odd.payload_len = 6;  // not whole floats
  EXPECT_EQ(ParseHeader(Datagram(odd, 6), &out), Reject::kBadPayload);
  Header half = Sample();
  half.encoding = 2;  // bfloat16: 2-byte values
  half.payload_len = 6;
  EXPECT_EQ(ParseHeader(Datagram(half, 6), &out), Reject::kNone);
  EXPECT_EQ(out.encoding, 2);
  half.payload_len = 5;
  EXPECT_EQ(ParseHeader(Datagram(half, 5), &out), Reject::kBadPayload);
  Header nack = Sample();
  nack.type = MsgType::kPushNack;
  nack.encoding = 1;  // only PUSH and RESULT carry values
  EXPECT_EQ(ParseHeader(Datagram(nack, 16), &out), Reject::kBadEncoding);
  Header zero_elems = Sample();
  zero_elems.tensor_elems = 0;
  EXPECT_EQ(ParseHeader(Datagram(zero_elems, 16), &out), Reject::kBadChunk);
}

// lost_class says where a repaired chunk was lost; without the flag it must stay 0, and it is a
// class like any other.
TEST(WireHeader, LostClassComesWithTheRepairedFlag) {
  Header h = Sample();
  h.flags = kFlagRepaired;
  h.lost_class = 3;
  std::vector<uint8_t> d = Datagram(h, 16);
  Header out;
  ASSERT_EQ(ParseHeader(d, &out), Reject::kNone);
  EXPECT_EQ(out.lost_class, 3);
  d[45] = 4;
  EXPECT_EQ(ParseHeader(d, &out), Reject::kBadClass);
  d[45] = 1;
  d[7] = 0;
  EXPECT_EQ(ParseHeader(d, &out), Reject::kReservedSet);
  d[7] = kFlagRepaired;
  d[46] = 1;
  EXPECT_EQ(ParseHeader(d, &out), Reject::kReservedSet);
}

// Every random mutation either parses to a header consistent with the datagram, or is rejected.
TEST(WireHeader, RandomMutationsNeverYieldInconsistentHeaders) {
  std::mt19937 rng(42);
  std::vector<uint8_t> good = Datagram(Sample(), 16);
  int accepted = 0;
  for (int i = 0; i < 200000; ++i) {
    std::vector<uint8_t> d = good;
    int flips = 1 + rng() % 4;
    for (int f = 0; f < flips; ++f) d[rng() % d.size()] = static_cast<uint8_t>(rng());
    if (rng() % 8 == 0) d.resize(rng() % (d.size() + 1));
    Header out;
    if (ParseHeader(d, &out) == Reject::kNone) {
      ++accepted;
      ASSERT_EQ(out.payload_len + kHeaderSize, d.size());
      ASSERT_LT(out.priority, kNumClasses);
      if (out.type == MsgType::kPush || out.type == MsgType::kResult) {
        ASSERT_LT(out.chunk, out.chunk_count);
      }
    }
  }
  EXPECT_GT(accepted, 0);  // payload bytes mutate freely, so some must pass
}

TEST(ChunkGeometry, CoversOddSizes) {
  ChunkGeometry g{10001, 1000};
  EXPECT_EQ(g.chunk_count(), 11u);
  EXPECT_EQ(g.elems(0), 1000u);
  EXPECT_EQ(g.elems(10), 1u);
  EXPECT_EQ(g.bytes(10), 4u);
  EXPECT_EQ(g.offset(10), 10000u);
  ChunkGeometry small{3, 1000};
  EXPECT_EQ(small.chunk_count(), 1u);
  EXPECT_EQ(small.elems(0), 3u);
}

TEST(Ranges, CollapseEncodeDecode) {
  std::vector<uint32_t> chunks = {0, 1, 2, 5, 7, 8, 100};
  std::vector<ChunkRange> r = ToRanges(chunks);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0], (ChunkRange{0, 3}));
  EXPECT_EQ(r[3], (ChunkRange{100, 1}));
  auto payloads = EncodeRanges(r, 1000);
  ASSERT_EQ(payloads.size(), 1u);
  auto back = DecodeRanges(payloads[0], 101);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, r);
  // Out of bounds for a smaller tensor.
  EXPECT_FALSE(DecodeRanges(payloads[0], 100).ok());
}

TEST(Ranges, SplitsAcrossPayloadsAndEmptyMeansNone) {
  std::vector<uint32_t> every_other;
  for (uint32_t c = 0; c < 1000; c += 2) every_other.push_back(c);
  auto payloads = EncodeRanges(ToRanges(every_other), 100);  // 12 ranges per payload
  EXPECT_EQ(payloads.size(), (500 + 11) / 12);
  size_t total = 0;
  for (auto& p : payloads) {
    EXPECT_LE(p.size(), 100u);
    auto d = DecodeRanges(p, 1000);
    ASSERT_TRUE(d.ok());
    total += d->size();
  }
  EXPECT_EQ(total, 500u);
  auto empty = EncodeRanges({}, 100);
  ASSERT_EQ(empty.size(), 1u);
  EXPECT_TRUE(DecodeRanges(empty[0], 1)->empty());
}

TEST(Ranges, RejectsLyingCountsAndZeroLengths) {
  std::vector<uint8_t> p = EncodeRanges(std::vector<ChunkRange>{{1, 2}}, 100)[0];
  p[0] = 2;  // claims two ranges, holds one
  EXPECT_FALSE(DecodeRanges(p, 10).ok());
  std::vector<uint8_t> zero = EncodeRanges(std::vector<ChunkRange>{{1, 0}}, 100)[0];
  EXPECT_FALSE(DecodeRanges(zero, 10).ok());
  std::vector<uint8_t> overflow = EncodeRanges(std::vector<ChunkRange>{{0xFFFFFFFF, 2}}, 100)[0];
  EXPECT_FALSE(DecodeRanges(overflow, 10).ok());
  EXPECT_FALSE(DecodeRanges(std::vector<uint8_t>{1, 0}, 10).ok());
}

std::vector<uint8_t> Signed(const MacKey& key, Header h, size_t payload) {
  h.flags |= kFlagMac;
  h.payload_len = static_cast<uint32_t>(payload);
  std::vector<uint8_t> d(kHeaderSize + payload + kMacSize);
  EncodeHeader(h, d.data());
  for (size_t i = 0; i < payload; ++i) d[kHeaderSize + i] = static_cast<uint8_t>(i * 31 + 7);
  ComputeMac(key, d.data(), d.data() + kHeaderSize, payload, d.data() + kHeaderSize + payload);
  return d;
}

TEST(WireMac, AnyChangedByteOrOtherKeyFailsVerification) {
  auto key = NewMacKey();
  auto other = NewMacKey();
  ASSERT_TRUE(key.ok() && other.ok());
  ASSERT_NE(*key, *other);
  std::vector<uint8_t> d = Signed(*key, Sample(), 64);
  Header h;
  ASSERT_EQ(ParseHeader(d, &h), Reject::kNone);
  EXPECT_EQ(h.payload_len, 64u);
  EXPECT_TRUE(VerifyMac(*key, d, h.payload_len));
  EXPECT_FALSE(VerifyMac(*other, d, h.payload_len));
  for (size_t i = 0; i < d.size(); ++i) {
    std::vector<uint8_t> t = d;
    t[i] ^= 0x01;
    EXPECT_FALSE(VerifyMac(*key, t, h.payload_len)) << "byte " << i << " changed unnoticed";
  }
  EXPECT_FALSE(VerifyMac(*key, absl::MakeConstSpan(d.data(), d.size() - 1), h.payload_len));
}

TEST(WireMac, TrailerLengthIsPartOfTheLengthCheck) {
  auto key = NewMacKey();
  ASSERT_TRUE(key.ok());
  std::vector<uint8_t> d = Signed(*key, Sample(), 16);
  Header h;
  EXPECT_EQ(ParseHeader(absl::MakeConstSpan(d.data(), d.size() - kMacSize), &h), Reject::kLengthMismatch);
  std::vector<uint8_t> longer = d;
  longer.push_back(0);
  EXPECT_EQ(ParseHeader(longer, &h), Reject::kLengthMismatch);
}

TEST(WireMac, KeyBytesRoundTrip) {
  auto key = NewMacKey();
  ASSERT_TRUE(key.ok());
  std::array<uint8_t, 32> bytes = MacKeyToBytes(*key);
  EXPECT_EQ(MacKeyFromBytes(bytes), *key);
}

// Derived keys are a function of the secret, the purpose and the index alone, and any change to
// one of them gives an unrelated key (every word differs).
TEST(WireMac, DerivedKeysDependOnSecretPurposeAndIndex) {
  const MacKey secret{1, 2, 3, 4}, other{1, 2, 3, 5};
  const MacKey k = DeriveMacKey(secret, KeyPurpose::kWorker, 7);
  EXPECT_EQ(DeriveMacKey(secret, KeyPurpose::kWorker, 7), k);
  for (const MacKey& d : {DeriveMacKey(other, KeyPurpose::kWorker, 7), DeriveMacKey(secret, KeyPurpose::kResults, 7),
                          DeriveMacKey(secret, KeyPurpose::kWorker, 6), DeriveMacKey(secret, KeyPurpose::kWorker, 8),
                          secret}) {
    for (size_t w = 0; w < 4; ++w) EXPECT_NE(d[w], k[w]) << "word " << w;
  }
  std::vector<uint8_t> d = Signed(k, Sample(), 16);
  EXPECT_TRUE(VerifyMac(k, d, 16));
  EXPECT_FALSE(VerifyMac(DeriveMacKey(secret, KeyPurpose::kWorker, 8), d, 16));
}

}  // namespace
}  // namespace dlcp::wire
