#!/usr/bin/env bash
# Round time under congestion, in one run on the emulated cluster (scripts/netbed/cluster.sh):
# 4 workers behind a strict-priority DSCP switch (1 Gbit/s ports, 64-packet drop-tail queues),
# with best-effort UDP cross traffic from a fifth host into every worker's port. Measures
#   - dlcp, bounded loss ε = 0.01;
#   - dlcp, reliable (ε = 0);
#   - Gloo's ring all-reduce over TCP;
# each on 20 MiB per round, dlcp with one aggregator on every worker host (so each link carries
# what ring all-reduce carries); and dlcp once more without cross traffic, for goodput against
# the link rate. MODES may add reliable_bf16 and clean_bf16: the same dlcp runs with bfloat16
# payloads (half the bytes; the floor stays float32's); clean_default, bounded_default and
# reliable_default: the client's default window (adaptive, at most 4 MiB), clean_reliable_default:
# reliable without cross traffic with that window, and clean_4mib_fixed,
# bounded_4mib_fixed and reliable_4mib_fixed: 4 MiB without adaptation. Also prints the physical floor: ring all-reduce's bytes per link, 2 S (N-1) / N,
# over the link rate. Prints one JSON line per system, then a ratio table, both with the cross
# traffic that reached the worker ports beside each system (its receivers' iperf3 reports). MTU (1500) and CHUNK
# (dlcp's payload bytes per datagram: 1400, or 8192 with MTU=9000) set the frame size. CROSS (300M)
# is the cross traffic's rate per worker port and CROSS_DSCP (0, best effort) its code point: 34
# puts it in the class dlcp's bulk data rides (another tenant's gradients, say).
# Needs root.
#   bench/netbed_compare.sh [BUILD_DIR]
set -Eeuo pipefail
BUILD=$(cd "${1:-build}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
CLUSTER="$HERE/../scripts/netbed/cluster.sh"
export PREFIX=${PREFIX:-dlcpb}  # its namespaces; the cluster itself: scripts/netbed/session.sh
ROUNDS=${ROUNDS:-10}
TENSOR=${TENSOR:-$((20 << 20))}
CROSS=${CROSS:-300M}  # per worker port
# dlcp bytes in flight per aggregator endpoint, fixed: tuned for this test bed (3 senders into a
# 64-packet queue). The *_default modes run the client's defaults instead: an adaptive window of
# at most 4 MiB (docs/congestion.md), against the same 4 MiB fixed.
WINDOW=${WINDOW:-131072}
export MTU=${MTU:-1500}
CHUNK=${CHUNK:-$([[ $MTU -ge 9000 ]] && echo 8192 || echo 1400)}
TUNED="--adaptive-window=false"
DEFAULTS="--window-bytes=4194304 --adaptive-window=true"
N=4
[[ $(id -u) == 0 ]] || { echo "netbed_compare: needs root" >&2; exit 1; }

source "$HERE/../scripts/netbed/session.sh"
netbed_start dlcp-netbed-bench
ip_of() { netbed_ip_of "$@"; }
netbed_worker_aggregators "$BUILD"

run_dlcp() {  # name loss_bound [nocross|cross] [encoding] [dlcp-bench flags; default: $TUNED]
  [[ ${3:-} == nocross ]] || netbed_cross_start 120
  # shellcheck disable=SC2086
  netbed_workers "$BUILD" "$work/$1" "$(netbed_worker_hosts)" --job="$1" --tensor-bytes="$TENSOR" \
    --chunk-bytes="$CHUNK" --rounds="$ROUNDS" --warmup=1 --loss-bound="$2" --window-bytes="$WINDOW" \
    --payload-encoding="${4:-f32}" ${5:-$TUNED}
  netbed_cross_stop
  local rows cross=0
  [[ ${3:-} == nocross ]] || cross=$(netbed_cross_received)
  rows=$(python3 "$HERE/../scripts/netbed/worker_rows.py" "$work/$1" 4 "$1")
  python3 - "$rows" "$1" "$cross" <<'PY'
import json, sys
rows = [r or {} for r in json.loads(sys.argv[1])]  # a failed worker counts as not exact
ok = all(r.get("exact") for r in rows)
print(json.dumps({"system": sys.argv[2], "cross_mbit": float(sys.argv[3]), "p50_ms": max(r.get("p50_ms", 0) for r in rows),
                  "p99_ms": max(r.get("p99_ms", 0) for r in rows),
                  "max_round_loss": max(r.get("max_round_loss", 0) for r in rows),
                  "bound_violations": sum(r.get("bound_violations", 0) for r in rows),
                  "retransmits": sum(r.get("retransmits", 0) for r in rows),
                  "window_cuts": sum(r.get("window_cuts", 0) for r in rows), "exact": ok}))
PY
}

run_gloo() {
  netbed_cross_start 180
  local store="$work/gloo-store" pids=()
  mkdir -p "$store"
  for i in 1 2 3 4; do
    ip netns exec "$PREFIX-w$i" "$BUILD/bench/gloo_allreduce" --workers $N --rank $((i - 1)) --store "$store" \
      --host "$(ip_of $i)" --tensor-bytes "$TENSOR" --rounds "$ROUNDS" --warmup 1 >"$work/gloo.$i" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || true; done
  netbed_cross_stop
  local cross
  cross=$(netbed_cross_received)
  "$BUILD/bench/gloo_allreduce" --summarize --store "$store" --workers $N --tensor-bytes "$TENSOR" --rounds "$ROUNDS" |
    sed "s/^{/{\"cross_mbit\":$cross,/"
}

MODES=${MODES:-"bounded reliable gloo clean"}
has() { [[ " $MODES " == *" $1 "* ]]; }
{
  has clean && run_dlcp dlcp_bounded_no_congestion 0.01 nocross
  has bounded && run_dlcp dlcp_bounded_eps0.01 0.01
  has reliable && run_dlcp dlcp_reliable 0
  has gloo && run_gloo
  has reliable_bf16 && run_dlcp dlcp_reliable_bf16 0 cross bf16
  has clean_bf16 && run_dlcp dlcp_reliable_bf16_no_congestion 0 nocross bf16
  # Out of the box: the adaptive window (at most 4 MiB), and 4 MiB fixed.
  has clean_default && run_dlcp dlcp_bounded_no_congestion_default_window 0.01 nocross f32 "$DEFAULTS"
  has bounded_default && run_dlcp dlcp_bounded_eps0.01_default_window 0.01 cross f32 "$DEFAULTS"
  has reliable_default && run_dlcp dlcp_reliable_default_window 0 cross f32 "$DEFAULTS"
  has clean_reliable_default && run_dlcp dlcp_reliable_no_congestion_default_window 0 nocross f32 "$DEFAULTS"
  has clean_4mib_fixed && run_dlcp dlcp_bounded_no_congestion_4mib_fixed 0.01 nocross f32 "--window-bytes=4194304 $TUNED"
  has bounded_4mib_fixed && run_dlcp dlcp_bounded_eps0.01_4mib_fixed 0.01 cross f32 "--window-bytes=4194304 $TUNED"
  has reliable_4mib_fixed && run_dlcp dlcp_reliable_4mib_fixed 0 cross f32 "--window-bytes=4194304 $TUNED"
  true
} | tee "$work/results.jsonl"
"$CLUSTER" stats >"$work/stats.txt"

python3 - "$work/results.jsonl" "$TENSOR" "$RATE" "$N" "$CROSS" "$MTU" "${CROSS_DSCP:-0}" <<'PY'
import json, re, sys
rows = {}
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); rows[r["system"]] = r
size, n = int(sys.argv[2]), int(sys.argv[4])
m = re.match(r"([\d.]+)([kmg]?)", sys.argv[3].lower())
rate = float(m[1]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m[2]]
floor_ms = 2 * size * (n - 1) / n * 8 / rate * 1e3
cross = "best-effort" if sys.argv[7] == "0" else f"DSCP {sys.argv[7]}"
print(f"\n{n} workers, {size >> 20} MiB per round, {sys.argv[3]} ports (MTU {sys.argv[6]}), {sys.argv[5]} {cross}"
      f" cross traffic into each worker port; physical floor {floor_ms:.1f} ms per round\n")
print("| system | p50 ms | p99 ms | p50 / floor | p99 / gloo p99 | p99 / reliable p99 (same setting) | worst round loss | chunks pushed again | cross traffic received, Mbit/s per port | exact |")
print("|---|---|---|---|---|---|---|---|---|---|")
g = rows.get("gloo_ring_tcp", {}).get("p99_ms") or float("nan")
def reliable_p99(name):
    # Each dlcp row against dlcp's reliable mode in the same setting (congestion, window, encoding);
    # Gloo against the reliable mode under congestion.
    if name.startswith("gloo"):
        ref = rows.get("dlcp_reliable") or rows.get("dlcp_reliable_default_window") or {}
    else:
        ref = rows.get(name.replace("dlcp_bounded_eps0.01", "dlcp_reliable")
                       .replace("dlcp_bounded_no_congestion", "dlcp_reliable_no_congestion")) or {}
    return ref.get("p99_ms") or float("nan")
names = ["dlcp_bounded_eps0.01", "dlcp_reliable", "gloo_ring_tcp", "dlcp_bounded_no_congestion"]
names += [n for n in ("dlcp_reliable_bf16", "dlcp_reliable_bf16_no_congestion") if n in rows]
names += [f"{m}_{w}" for w in ("default_window", "4mib_fixed")
          for m in ("dlcp_bounded_no_congestion", "dlcp_bounded_eps0.01", "dlcp_reliable", "dlcp_reliable_no_congestion")
          if f"{m}_{w}" in rows]
for name in names:
    r = rows.get(name)
    if not r:
        print(f"| {name} | - | - | - | - | - | - | - | - | not run (or no result) |"); continue
    print(f"| {name} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['p50_ms'] / floor_ms:.2f} | {r['p99_ms'] / g:.2f} |"
          f" {r['p99_ms'] / reliable_p99(name):.2f} | {r.get('max_round_loss', 0):.4f} | {r.get('retransmits', '-')} |"
          f" {r.get('cross_mbit') or '-'} | {r['exact']} |")
for name, how in (("dlcp_bounded_no_congestion", "with the tuned fixed window"),
                  ("dlcp_bounded_no_congestion_default_window", "with the default window"),
                  ("dlcp_reliable_no_congestion_default_window", "reliable, with the default window,")):
    c = rows.get(name)
    if c and c["p50_ms"] > 0:
        print(f"\nWithout congestion dlcp {how} reaches {floor_ms / c['p50_ms'] * 100:.0f}% of the link rate at p50"
              " (ring all-reduce's bytes per link over the round time).")
PY
