#!/usr/bin/env bash
# Time to accuracy under congestion, in one run on the emulated cluster (scripts/netbed/cluster.sh):
# 4 workers train the digits CNN (dlcp.examples.digits, first linear layer widened by HIDDEN so
# that each step moves megabytes) behind a strict-priority DSCP switch with best-effort UDP cross
# traffic into every worker's port, three ways in turn:
#   - dlcp, bounded loss ε = EPS, DeAR schedule (DistributedOptimizer);
#   - dlcp, reliable (ε = 0), DeAR schedule;
#   - DDP with Gloo's ring all-reduce over TCP.
# dlcp runs one aggregator on every worker host. Target accuracy: the reliable dlcp run's final
# accuracy minus 0.5 points; time to accuracy is the wall time of the first epoch that reaches
# it. Prints one JSON line per run, then a ratio table. Needs root.
#   bench/netbed_tta.sh [BUILD_DIR]
set -Eeuo pipefail
BUILD=$(cd "${1:-build}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
CLUSTER="$HERE/../scripts/netbed/cluster.sh"
export PREFIX=${PREFIX:-dlcpa}  # its namespaces; the cluster itself: scripts/netbed/session.sh
EPOCHS=${EPOCHS:-8}
HIDDEN=${HIDDEN:-2048}
EPS=${EPS:-0.01}
CROSS=${CROSS:-300M}
WINDOW=${WINDOW:-131072}
PYTHON=${PYTHON:-/usr/bin/python3}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}  # seconds per run
[[ $(id -u) == 0 ]] || { echo "netbed_tta: needs root" >&2; exit 1; }
"$PYTHON" -c "import torch, sklearn" 2>/dev/null || { echo "netbed_tta: needs torch and sklearn for $PYTHON" >&2; exit 1; }

source "$HERE/../scripts/netbed/session.sh"
netbed_start dlcp-netbed-tta
netbed_worker_aggregators "$BUILD"

run() {  # name mode loss_bound
  netbed_cross_start 900
  local pids=() i
  for i in 1 2 3 4; do
    # Gloo finds its interface by the host name, which would give 127.0.0.1 here.
    ip netns exec "$PREFIX-w$i" env PYTHONPATH="$BUILD/python" GLOO_SOCKET_IFNAME=eth0 \
      timeout "$RUN_TIMEOUT" "$PYTHON" -m dlcp.examples.digits --json --plaintext \
      --mode="$2" --job="tta-$1-$$" --rank=$((i - 1)) --world=4 --aggregators="$agg_list" --data-host="$(netbed_ip_of $i)" \
      --chunk-bytes=1400 --window-bytes="$WINDOW" --loss-bound="$3" --epochs="$EPOCHS" --hidden="$HIDDEN" \
      --optimizer=adam --gloo-init="tcp://$(netbed_ip_of 1):29500" >"$work/$1.$i" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || true; done
  netbed_cross_stop
  local rows
  rows=$("$PYTHON" "$HERE/../scripts/netbed/worker_rows.py" "$work/$1" 4 "$1")
  "$PYTHON" - "$rows" "$1" <<'PY'
import json, sys
rows = json.loads(sys.argv[1])
if None in rows:
    sys.exit(0)
print(json.dumps({"run": sys.argv[2], "history": rows[0]["history"]}))
PY
}

{
  run dlcp_bounded dlcp "$EPS"
  run dlcp_reliable dlcp 0
  run gloo_ddp gloo 0
} | tee "$work/results.jsonl"
"$CLUSTER" stats >"$work/stats.txt"

"$PYTHON" - "$work/results.jsonl" "$EPS" "$HIDDEN" "$CROSS" "$RATE" <<'PY'
import json, sys
runs = {}
for l in open(sys.argv[1]):
    if l.startswith("{"):
        r = json.loads(l); runs[r["run"]] = r["history"]
ref = runs.get("dlcp_reliable")
target = ref[-1][1] - 0.5 if ref else float("nan")
def tta(h):
    return next((t for t, acc in h if acc >= target), float("inf"))
print(f"\n4 workers, digits CNN (hidden {sys.argv[3]}), {sys.argv[5]} ports, {sys.argv[4]} best-effort cross traffic"
      f" into each worker port; target accuracy {target:.2f}% (reliable dlcp's final minus 0.5)\n")
print("| run | final accuracy % | time to target s | wall time s | gloo TTA / this TTA |")
print("|---|---|---|---|---|")
g = tta(runs["gloo_ddp"]) if "gloo_ddp" in runs else float("nan")
for name in (f"dlcp_bounded", "dlcp_reliable", "gloo_ddp"):
    h = runs.get(name)
    if not h:
        print(f"| {name} | failed | - | - | - |"); continue
    print(f"| {name}{' eps=' + sys.argv[2] if name == 'dlcp_bounded' else ''} | {h[-1][1]:.2f} | {tta(h):.1f} |"
          f" {h[-1][0]:.1f} | {g / tta(h):.2f} |")
PY
