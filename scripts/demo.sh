#!/usr/bin/env bash
# The main job on loopback: 2 dlcpd aggregators and 4 workers all-reduce float32 gradients for
# 200 rounds, every element checked exactly. Used by `make demo`.
set -euo pipefail
BUILD=${1:-build}
ROUNDS=${ROUNDS:-200}
WORKERS=${WORKERS:-4}
DLCPD="$BUILD/server/dlcpd"
BENCH="$BUILD/bench/dlcp-bench"
DLCPCTL="$BUILD/client/dlcpctl"
for b in "$DLCPD" "$BENCH" "$DLCPCTL"; do
  [ -x "$b" ] || { echo "demo: $b is missing; run 'make build' first" >&2; exit 1; }
done

work=$(mktemp -d /tmp/dlcp-demo.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

aggregators=()
for i in 0 1; do
  "$DLCPD" --host=127.0.0.1 --port=0 --data-port=0 --log-level=warning --plaintext \
    --ready-file="$work/agg$i.ready" 2>"$work/agg$i.log" &
  pids+=($!)
done
for i in 0 1; do
  for _ in $(seq 1 100); do [ -s "$work/agg$i.ready" ] && break; sleep 0.05; done
  [ -s "$work/agg$i.ready" ] || { echo "demo: aggregator $i did not start:"; cat "$work/agg$i.log"; exit 1; }
  port=$(sed -E 's/.*"control_port":([0-9]+).*/\1/' "$work/agg$i.ready")
  aggregators+=("127.0.0.1:$port")
done
list=$(IFS=,; echo "${aggregators[*]}")

echo "dlcp demo: 2 aggregators (${list}), ${WORKERS} workers, ${ROUNDS} rounds of 4 x 1 MiB float32 gradients"
"$BENCH" --plaintext --aggregators="$list" --workers="$WORKERS" --tensors=4 --tensor-bytes=1048576 \
  --rounds="$ROUNDS" --warmup=2 --progress --timeout-s=600
echo
echo "aggregator view (dlcpctl status):"
"$DLCPCTL" status --plaintext --aggregators="$list"
