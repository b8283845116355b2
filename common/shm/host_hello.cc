#include "common/shm/host_hello.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/shm/stage_layout.h"
#include "common/wire/endian.h"

namespace dlcp {
namespace {

constexpr uint32_t kHelloMagic = 0x4F4C4844;    // "DHLO"
constexpr uint32_t kWelcomeMagic = 0x434C5744;  // "DWLC"
constexpr size_t kMaxReason = 1024;

void Put32(std::vector<uint8_t>& out, uint32_t v) {
  out.resize(out.size() + 4);
  wire::PutLE32(out.data() + out.size() - 4, v);
}
void Put64(std::vector<uint8_t>& out, uint64_t v) {
  out.resize(out.size() + 8);
  wire::PutLE64(out.data() + out.size() - 8, v);
}

// Reads fields in order; any read past the end makes ok() false.
class Reader {
 public:
  explicit Reader(absl::Span<const uint8_t> b) : b_(b) {}
  uint32_t U32() {
    if (!Need(4)) return 0;
    pos_ += 4;
    return wire::GetLE32(b_.data() + pos_ - 4);
  }
  uint64_t U64() {
    if (!Need(8)) return 0;
    pos_ += 8;
    return wire::GetLE64(b_.data() + pos_ - 8);
  }
  std::string Bytes(size_t n) {
    if (!Need(n)) return {};
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  bool ok() const { return ok_; }
  bool at_end() const { return ok_ && pos_ == b_.size(); }

 private:
  bool Need(size_t n) {
    if (!ok_ || b_.size() - pos_ < n) ok_ = false;
    return ok_;
  }
  absl::Span<const uint8_t> b_;
  size_t pos_ = 0;
  bool ok_ = true;
};

absl::Status Bad(const std::string& what) { return absl::InvalidArgumentError(absl::StrCat("host socket: ", what)); }

}  // namespace

std::vector<uint8_t> EncodeHostHello(const HostHello& h) {
  std::vector<uint8_t> out;
  Put32(out, kHelloMagic);
  Put32(out, kHostHelloVersion);
  Put32(out, h.world_size);
  Put32(out, h.rank);
  Put32(out, h.local_size);
  Put32(out, h.standby ? 1 : 0);
  Put32(out, static_cast<uint32_t>(h.job_name.size()));
  out.insert(out.end(), h.job_name.begin(), h.job_name.end());
  return out;
}

absl::StatusOr<HostHello> DecodeHostHello(absl::Span<const uint8_t> bytes) {
  Reader r(bytes);
  if (r.U32() != kHelloMagic || !r.ok()) return Bad("not a dlcp hello");
  const uint32_t version = r.U32();
  if (version != kHostHelloVersion) return Bad(absl::StrCat("hello version ", version, ", not ", kHostHelloVersion));
  HostHello h;
  h.world_size = r.U32();
  h.rank = r.U32();
  h.local_size = r.U32();
  const uint32_t flags = r.U32();
  if (flags > 1) return Bad(absl::StrCat("hello flags ", flags, " unknown"));
  h.standby = flags == 1;
  const uint32_t name_len = r.U32();
  if (!r.ok() || name_len == 0 || name_len > kMaxHostJobName) return Bad("job name missing or too long");
  h.job_name = r.Bytes(name_len);
  if (!r.at_end()) return Bad("hello of the wrong length");
  if (h.rank >= h.world_size) return Bad(absl::StrCat("rank ", h.rank, " is not below world_size ", h.world_size));
  if (h.local_size < 2 || h.local_size > std::min(h.world_size, kMaxStageMembers)) {
    return Bad(absl::StrCat("local_size ", h.local_size, " outside [2, min(world_size, ", kMaxStageMembers, ")]"));
  }
  return h;
}

std::vector<uint8_t> EncodeHostWelcome(const HostWelcome& w) {
  std::vector<uint8_t> out;
  Put32(out, kWelcomeMagic);
  Put32(out, kHostHelloVersion);
  Put32(out, static_cast<uint32_t>(w.code));
  const std::string reason = w.reason.substr(0, kMaxReason);
  Put32(out, static_cast<uint32_t>(reason.size()));
  out.insert(out.end(), reason.begin(), reason.end());
  Put32(out, w.member);
  Put64(out, w.slot_bytes);
  Put32(out, static_cast<uint32_t>(w.ranks.size()));
  for (uint32_t rank : w.ranks) Put32(out, rank);
  return out;
}

absl::StatusOr<HostWelcome> DecodeHostWelcome(absl::Span<const uint8_t> bytes) {
  Reader r(bytes);
  if (r.U32() != kWelcomeMagic || !r.ok()) return Bad("not a dlcpd welcome");
  const uint32_t version = r.U32();
  if (version != kHostHelloVersion) return Bad(absl::StrCat("welcome version ", version, ", not ", kHostHelloVersion));
  HostWelcome w;
  const uint32_t code = r.U32();
  if (code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) return Bad("unknown status code");
  w.code = static_cast<absl::StatusCode>(code);
  const uint32_t reason_len = r.U32();
  if (reason_len > kMaxReason) return Bad("reason too long");
  w.reason = r.Bytes(reason_len);
  w.member = r.U32();
  w.slot_bytes = r.U64();
  const uint32_t count = r.U32();
  if (!r.ok() || count > kMaxStageMembers) return Bad("too many members");
  for (uint32_t i = 0; i < count; ++i) w.ranks.push_back(r.U32());
  if (!r.at_end()) return Bad("welcome of the wrong length");
  if (w.code != absl::StatusCode::kOk) return w;
  if (count < 2 || w.member >= count) return Bad("welcome without its members");
  if (!std::is_sorted(w.ranks.begin(), w.ranks.end()) ||
      std::adjacent_find(w.ranks.begin(), w.ranks.end()) != w.ranks.end()) {
    return Bad("welcome ranks not ascending");
  }
  if (w.slot_bytes == 0 || w.slot_bytes % 4096 != 0 || w.slot_bytes > (uint64_t{1} << 40)) {
    return Bad("welcome slot size not whole pages");
  }
  return w;
}

}  // namespace dlcp
