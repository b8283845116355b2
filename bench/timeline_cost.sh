#!/usr/bin/env bash
# What the timeline (client option timeline, DLCP_TIMELINE) costs a step: the same jobs with and
# without it against one local dlcpd, interleaved in one run. The worst case for it is many small
# tensors (an event per op moment, many ops per step); a few large ones are the other end. Prints
# JSON lines and a ratio table (p50 round time, on over off).   bench/timeline_cost.sh [BUILD_DIR]
set -euo pipefail
BUILD=${1:-build}
REPS=${REPS:-5}
source "$(dirname "$0")/loopback_lib.sh"
start_dlcpd agg
for rep in $(seq 1 "$REPS"); do
  for spec in "4 262144 64 30" "4 4194304 8 30" "2 104857600 1 10"; do
    read -r n size tensors rounds <<<"$spec"
    for mode in off on; do
      flags=()
      [ "$mode" = on ] && flags=(--timeline="$BENCH_WORK/timeline-$rep-%r.json")
      run_job agg "\"timeline\":\"$mode\"" --workers="$n" --tensor-bytes="$size" \
        --tensors="$tensors" --rounds="$rounds" --warmup=2 --loss-bound=0 "${flags[@]}"
    done
  done
done
# Every trace must hold a complete op for each op the jobs ran, none dropped.
for f in "$BENCH_WORK"/timeline-*.json; do
  grep -q '"dropped_events":0' "$f" || { echo "$f dropped events or was not closed" >&2; exit 1; }
done
report timeline <<'PY'
header("workers", "tensors per round", "p50 ms, timeline off", "on", "on / off", "exact")
for (n, b), g in sorted(groups.items()):
    off, on = med(g["off"], "p50_ms"), med(g["on"], "p50_ms")
    shape = f"{g['off'][0]['tensors']} x {b // 1024} KiB"
    row(n, shape, f"{off:.2f}", f"{on:.2f}", f"{on / off:.3f}", all(r["exact"] for r in g["off"] + g["on"]))
PY
