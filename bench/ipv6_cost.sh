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
PYTHONPATH="$(dirname "$0")" python3 - "$BENCH_OUT" <<'PY'
import sys, statistics
from loopback_groups import by_shape
groups = by_shape(sys.argv[1], "family")
print()
print("| workers | size | family | p50 ms | p50 / IPv4 | goodput Gbit/s | goodput / IPv4 | exact |")
print("|---|---|---|---|---|---|---|---|")
for (n, b), g in sorted(groups.items()):
    base = {k: statistics.median(r[k] for r in g["ipv4"]) for k in ("p50_ms", "goodput_gbps")}
    for family in ("ipv4", "ipv6"):
        p50 = statistics.median(r["p50_ms"] for r in g[family])
        gbps = statistics.median(r["goodput_gbps"] for r in g[family])
        exact = all(r["exact"] for r in g[family])
        print(f"| {n} | {b / 1048576:.0f} MiB | {family} | {p50:.1f} | {p50 / base['p50_ms']:.2f} | {gbps:.2f} | "
              f"{gbps / base['goodput_gbps']:.2f} | {exact} |")
PY
