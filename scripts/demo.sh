#!/usr/bin/env bash
# The main job on loopback: 2 dlcpd aggregators and 4 workers train a CNN on the digits data set
# three ways (dlcp with a loss bound and injected loss, dlcp reliable, DDP with Gloo), then print
# the accuracies and plot them against wall time. Without PyTorch it says so and runs the C++
# benchmark instead: 200 rounds of float32 gradients, every element checked exactly.
# Used by `make demo`.
set -euo pipefail
BUILD=${1:-build}
ROUNDS=${ROUNDS:-200}
WORKERS=${WORKERS:-4}
EPOCHS=${EPOCHS:-10}
PYTHON=${PYTHON:-/usr/bin/python3}
PLOT=${PLOT:-$BUILD/dlcp-demo.png}
DLCPD="$BUILD/server/dlcpd"
BENCH="$BUILD/bench/dlcp_bench/dlcp-bench"
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
  # UDP on both sides, chosen rather than probed: the demo runs on loopback, and each worker's
  # probe would log why it fell back to UDP. The two stand for two nodes' dlcpd, each with a host
  # socket of its own; the workers push their own (--host-stage=false below), so that the demo
  # shows the aggregators at work rather than one host stage of the whole job.
  "$DLCPD" --host=127.0.0.1 --port=0 --data-port=0 --log-level=warning --plaintext --transport=udp \
    --host-socket="$work/agg$i.sock" --ready-file="$work/agg$i.ready" 2>"$work/agg$i.log" &
  pids+=($!)
done
for i in 0 1; do
  for _ in $(seq 1 100); do [ -s "$work/agg$i.ready" ] && break; sleep 0.05; done
  [ -s "$work/agg$i.ready" ] || { echo "demo: aggregator $i did not start:"; cat "$work/agg$i.log"; exit 1; }
  port=$(sed -E 's/.*"control_port":([0-9]+).*/\1/' "$work/agg$i.ready")
  aggregators+=("127.0.0.1:$port")
done
list=$(IFS=,; echo "${aggregators[*]}")

trained=0
if "$PYTHON" -c "import torch, sklearn" 2>/dev/null && [ -d "$BUILD/python/dlcp" ]; then
  trained=1
  echo "dlcp demo: 2 aggregators (${list})"
  PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" scripts/demo_train.py --aggregators="$list" \
    --workers="$WORKERS" --epochs="$EPOCHS" --plot="$PLOT"
else
  echo "dlcp demo: PyTorch or scikit-learn is missing for $PYTHON (or the Python binding was not built),"
  echo "so no training; running the C++ benchmark instead."
  echo "dlcp demo: 2 aggregators (${list}), ${WORKERS} workers, ${ROUNDS} rounds of 4 x 1 MiB float32 gradients"
  "$BENCH" --plaintext --transport=udp --host-stage=false --aggregators="$list" --workers="$WORKERS" --tensors=4 \
    --tensor-bytes=1048576 --rounds="$ROUNDS" --warmup=2 --progress --timeout-s=600
fi
echo
echo "aggregator view (dlcpctl status):"
"$DLCPCTL" status --plaintext --aggregators="$list"
if [ "$trained" = 1 ]; then
  echo "(tensors are split over the aggregators in blocks of 64 chunks; this model has 38 k"
  echo " parameters, so each of its tensors fits one block, and its rounds land on the one"
  echo " aggregator that the tensor's key hashes to)"
fi
