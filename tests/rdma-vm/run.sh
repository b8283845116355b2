#!/usr/bin/env bash
# The RDMA tests against real verbs: boots the Soft-RoCE VM (rxevm.sh) with this build's
# rdma_test, transport_test and allreduce_test (their RDMA cases), dlcpd, dlcp-bench and dlcpctl,
# and runs guest.sh there. Results and logs come back to BUILD/rdma-vm/out. Skips (exit 77) only if qemu itself cannot run here.
# Usage: tests/rdma-vm/run.sh BUILD_DIR
set -euo pipefail
BUILD=$(readlink -f "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
if ! qemu-system-x86_64 -version >/dev/null 2>&1; then
  echo "rdma-vm: SKIP: qemu-system-x86_64 cannot run here (scripts/install-deps.sh installs qemu-system-x86)"
  exit 77
fi
for b in tests/rdma_test tests/transport_test tests/allreduce_test server/dlcpd bench/dlcp_bench/dlcp-bench client/dlcpctl; do
  [ -x "$BUILD/$b" ] || { echo "rdma-vm: $BUILD/$b is missing (built with DLCP_WITH_RDMA=ON?)"; exit 1; }
done
OUT=$BUILD/rdma-vm/out
rm -rf "$OUT" && mkdir -p "$OUT"
GUEST=$BUILD/rdma-vm/guest-run.sh
{ echo "DLCP_BUILD=$BUILD"; cat "$HERE/guest.sh"; } > "$GUEST"
rc=0
bash "$HERE/rxevm.sh" --out "$OUT" --timeout 540 -f "$GUEST" \
  --copy "$BUILD/tests/rdma_test" --copy "$BUILD/tests/transport_test" --copy "$BUILD/tests/allreduce_test" --copy "$BUILD/server/dlcpd" --copy "$BUILD/bench/dlcp_bench/dlcp-bench" --copy "$BUILD/client/dlcpctl" || rc=$?
echo "rdma-vm: guest exit status $rc; logs in $OUT"
exit $rc
