#!/usr/bin/env bash
# The IPv4 data plane against the IPv6 one: the same jobs against a local dlcpd on 127.0.0.1 and
# one on ::1, interleaved in one run. Prints JSON lines and a ratio table (p50 round time and
# goodput, IPv6 over IPv4). On one host the data path is CPU-bound, so the ratio shows what IPv6
# costs per datagram (its 40-byte header, its stack); on a fabric, 20 bytes more per datagram.
#   bench/ipv6_cost.sh [BUILD_DIR]
set -euo pipefail
BUILD=${1:-build}
REPS=${REPS:-3}
source "$(dirname "$0")/loopback_lib.sh"
start_dlcpd ipv4
start_dlcpd ipv6 --host=::1
for rep in $(seq 1 "$REPS"); do
  for spec in "2 104857600 5" "4 8388608 30"; do
    read -r n size rounds <<<"$spec"
    for family in ipv4 ipv6; do
      run_job "$family" "\"family\":\"$family\"" --workers="$n" --tensor-bytes="$size" --rounds="$rounds" --warmup=2 \
        --loss-bound=0
    done
  done
done
report family <<'PY'
header("workers", "size", "family", "p50 ms", "p50 / IPv4", "goodput Gbit/s", "goodput / IPv4", "exact")
for (n, b), g in sorted(groups.items()):
    base_p50, base_gbps = med(g["ipv4"], "p50_ms"), med(g["ipv4"], "goodput_gbps")
    for family in ("ipv4", "ipv6"):
        p50, gbps = med(g[family], "p50_ms"), med(g[family], "goodput_gbps")
        row(n, size(b), family, f"{p50:.1f}", f"{p50 / base_p50:.2f}", f"{gbps:.2f}", f"{gbps / base_gbps:.2f}",
            all(r["exact"] for r in g[family]))
PY
