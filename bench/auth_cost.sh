#!/usr/bin/env bash
# The end-to-end cost of data-packet authentication: the same jobs against two aggregators, one
# with --data-auth (the default) and one without, interleaved in one run. Prints JSON lines and a
# ratio table (authenticated time / unauthenticated time).  bench/auth_cost.sh [BUILD_DIR]
set -euo pipefail
BUILD=${1:-build}
REPS=${REPS:-3}
out=$(mktemp /tmp/dlcp-auth.XXXXXX)
work=$(mktemp -d /tmp/dlcp-auth-aggs.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$out" "$work"; }
trap cleanup EXIT
declare -A agg
for mode in on off; do
  flag=$([ $mode = on ] && echo --data-auth || echo --no-data-auth)
  "$BUILD/server/dlcpd" --host=127.0.0.1 --port=0 --data-port=0 --plaintext --log-level=warning $flag \
    --ready-file="$work/$mode.ready" 2>"$work/$mode.log" &
  pids+=($!)
done
for mode in on off; do
  for _ in $(seq 1 100); do [ -s "$work/$mode.ready" ] && break; sleep 0.05; done
  agg[$mode]="127.0.0.1:$(sed -E 's/.*"control_port":([0-9]+).*/\1/' "$work/$mode.ready")"
done
for rep in $(seq 1 "$REPS"); do
  for spec in "2 104857600 5" "4 4194304 30"; do
    read -r n size rounds <<<"$spec"
    for mode in on off; do
      j=$("$BUILD/bench/dlcp-bench" --plaintext --aggregators="${agg[$mode]}" --workers="$n" --tensor-bytes="$size" \
          --rounds="$rounds" --warmup=2 --json | tail -1)
      echo "{\"auth\":\"$mode\",${j#\{}" | tee -a "$out"
    done
  done
done
python3 - "$out" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
groups = {}
for r in rows:
    groups.setdefault((r["workers"], r["tensor_bytes"]), {}).setdefault(r["auth"], []).append(r["p50_ms"])
print()
print("| workers | size | p50 ms, auth off | p50 ms, auth on | on/off |")
print("|---|---|---|---|---|")
for (n, b), g in sorted(groups.items()):
    on, off = statistics.median(g["on"]), statistics.median(g["off"])
    print(f"| {n} | {b / 1048576:.0f} MiB | {off:.1f} | {on:.1f} | {on / off:.2f} |")
PY
