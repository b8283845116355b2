#!/usr/bin/env bash
# dlcp against Gloo's ring all-reduce (TCP on loopback), both measured in one run on this machine:
# 2 and 4 workers, 4 MiB and 100 MiB. dlcp runs one aggregator per worker, as on a cluster with an
# aggregator on every node, and 64 KiB datagrams (the loopback MTU). Like for like, dlcp runs
# without data-packet authentication (DATA_AUTH=on to include it; Gloo's TCP transport
# authenticates nothing; bench/auth_cost.sh measures that cost on its own). Prints one JSON line
# per measurement, then a ratio table (dlcp time / Gloo time; below 1 means dlcp is faster).
#   bench/compare_gloo/compare_gloo.sh [BUILD_DIR]
set -euo pipefail
BUILD=${1:-build}
WORKERS_LIST=${WORKERS_LIST:-"2 4"}
SIZES=${SIZES:-"4194304 104857600"}
CHUNK=${CHUNK:-65000}
DATA_AUTH=${DATA_AUTH:-off}
auth_flag=$([ "$DATA_AUTH" = on ] && echo --data-auth || echo --no-data-auth)
out=$(mktemp /tmp/dlcp-compare.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -f "$out"; }
trap cleanup EXIT

rounds_for() { if [ "$1" -ge 50000000 ]; then echo 7; else echo 30; fi; }

for n in $WORKERS_LIST; do
  work=$(mktemp -d /tmp/dlcp-compare-aggs.XXXXXX)
  aggs=()
  for i in $(seq 0 $((n - 1))); do
    "$BUILD/server/dlcpd" --host=127.0.0.1 --port=0 --data-port=0 --log-level=warning --plaintext "$auth_flag" \
      --ready-file="$work/$i.ready" 2>"$work/$i.log" &
    pids+=($!)
  done
  for i in $(seq 0 $((n - 1))); do
    for _ in $(seq 1 100); do [ -s "$work/$i.ready" ] && break; sleep 0.05; done
    aggs+=("127.0.0.1:$(sed -E 's/.*"control_port":([0-9]+).*/\1/' "$work/$i.ready")")
  done
  list=$(IFS=,; echo "${aggs[*]}")
  for size in $SIZES; do
    r=$(rounds_for "$size")
    g=$("$BUILD/bench/gloo_allreduce" --workers "$n" --tensor-bytes "$size" --rounds "$r" | tail -1)
    d=$("$BUILD/bench/dlcp_bench/dlcp-bench" --plaintext --aggregators="$list" --workers="$n" --tensor-bytes="$size" --rounds="$r" \
        --warmup=2 --chunk-bytes="$CHUNK" --json | tail -1)
    echo "$g" | tee -a "$out"
    echo "{\"system\":\"dlcp_udp\",${d#\{}" | tee -a "$out"
  done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pids=()
  rm -rf "$work"
done

python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in rows:
    by.setdefault((r["workers"], r["tensor_bytes"]), {})[r["system"]] = r
print()
print("| workers | size | gloo p50 ms | dlcp p50 ms | dlcp/gloo p50 | gloo p99 ms | dlcp p99 ms | dlcp/gloo p99 | exact |")
print("|---|---|---|---|---|---|---|---|---|")
for (n, b), s in sorted(by.items()):
    g, d = s.get("gloo_ring_tcp"), s.get("dlcp_udp")
    if not g or not d:
        continue
    print(f"| {n} | {b / 1048576:.0f} MiB | {g['p50_ms']:.1f} | {d['p50_ms']:.1f} | {d['p50_ms'] / g['p50_ms']:.2f} "
          f"| {g['p99_ms']:.1f} | {d['p99_ms']:.1f} | {d['p99_ms'] / g['p99_ms']:.2f} | {g['exact'] and d['exact']} |")
PY
