#include "common/wire/version_check.h"

#include "absl/strings/str_cat.h"
#include "common/base/build_config.h"
#include "common/base/utf8.h"
#include "common/wire/header.h"

namespace dlcp::wire {

absl::Status CheckPeerWireVersion(uint32_t announced, absl::string_view peer_release, absl::string_view peer,
                                  absl::string_view self) {
  const uint32_t theirs = AnnouncedWireVersion(announced);
  if (theirs == kVersion) return absl::OkStatus();
  std::string release(peer_release);
  TruncateUtf8(&release, 64);  // the peer's text: quoted, not trusted to be short
  return absl::FailedPreconditionError(absl::StrCat(
      peer, " speaks data-plane wire version ", theirs,
      release.empty() ? std::string() : absl::StrCat(" (dlcp ", release, ")"), " but ", self,
      " speaks version ", static_cast<uint32_t>(kVersion), " (dlcp ", DLCP_VERSION,
      "): run dlcp releases of the same wire format on every worker and aggregator of a job"));
}

}  // namespace dlcp::wire
