#!/usr/bin/env bash
# Time to accuracy on the emulated cluster (scripts/netbed/cluster.sh), communication-bound:
# 4 workers train the digits CNN (dlcp.examples.digits) with its first linear layer widened to
# HIDDEN (4096: 8.4 MB of gradients a step), BATCH samples per worker and step, and SGD
# (OPTIMIZER; Adam doubles the compute), so that moving gradients, not computing them, sets the
# pace. Each trial runs, in this order, with fresh processes:
#   - dlcp_bounded   dlcp with the client's defaults and an explicit ε = EPS (DistributedOptimizer);
#   - dlcp_reliable  dlcp with the client's defaults (exact);
#   - gloo_ddp       DDP with Gloo's ring all-reduce over TCP;
#   - compute_only   the same steps with no communication at all (each worker alone), which gives
#                    the share of a Gloo step that is communication.
# TRIALS trials per bed, interleaved (A B C D A B C D ...), on each bed of BEDS:
#   - steady  CROSS best-effort UDP cross traffic into every worker's port, at an even pace;
#   - bursty  the same average rate sent in bursts of BURST back-to-back datagrams (on/off
#             microbursts), each of which overflows the port's queue for a short spell.
# Ports run at RATE with MTU 9000, so that the client's default chunk (8192 bytes) is one frame.
# Test accuracy is measured every EVAL_EVERY steps (the clock stops meanwhile); time to accuracy
# is the training time at which a run first reaches the target: DDP's median final accuracy on
# that bed, less 0.5 points. Prints one JSON line per run, then tables (bench/tta_report.py), and
# writes the plot to PLOT. Needs root, torch and scikit-learn.
#   bench/netbed_tta.sh [BUILD_DIR]
set -Eeuo pipefail
BUILD=$(cd "${1:-build}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
CLUSTER="$HERE/../scripts/netbed/cluster.sh"
export PREFIX=${PREFIX:-dlcpa}  # its namespaces; the cluster itself: scripts/netbed/session.sh
export MTU=${MTU:-9000}
TRIALS=${TRIALS:-3}
BEDS=${BEDS:-steady bursty}
EPOCHS=${EPOCHS:-2}
HIDDEN=${HIDDEN:-4096}
BATCH=${BATCH:-8}
OPTIMIZER=${OPTIMIZER:-sgd}
EVAL_EVERY=${EVAL_EVERY:-11}
EPS=${EPS:-0.01}
CROSS=${CROSS:-300M}
BURST=${BURST:-1000}
PLOT=${PLOT:-$BUILD/netbed-tta.png}
PYTHON=${PYTHON:-/usr/bin/python3}
RUN_TIMEOUT=${RUN_TIMEOUT:-600}  # seconds per run
[[ $(id -u) == 0 ]] || { echo "netbed_tta: needs root" >&2; exit 1; }
"$PYTHON" -c "import torch, sklearn" 2>/dev/null || { echo "netbed_tta: needs torch and sklearn for $PYTHON" >&2; exit 1; }

source "$HERE/../scripts/netbed/session.sh"
netbed_start dlcp-netbed-tta
netbed_worker_aggregators "$BUILD"

run() {  # bed trial system
  local bed=$1 trial=$2 system=$3 mode=dlcp eps=0 pids=() i
  case $system in
    dlcp_bounded) eps=$EPS ;;
    gloo_ddp) mode=gloo ;;
    compute_only) mode=local ;;
  esac
  local rate=$CROSS
  [[ $bed == bursty ]] && rate="$CROSS/$BURST"
  CROSS=$rate netbed_cross_start 900
  local extra=()
  [[ $system == dlcp_bounded ]] && extra+=(--loss-bound="$eps")
  for i in 1 2 3 4; do
    # Gloo finds its interface by the host name, which would give 127.0.0.1 here.
    ip netns exec "$PREFIX-w$i" env PYTHONPATH="$BUILD/python" GLOO_SOCKET_IFNAME=eth0 \
      timeout "$RUN_TIMEOUT" "$PYTHON" -m dlcp.examples.digits --json --plaintext --mode="$mode" \
      --job="tta-$bed-$trial-$system-$$" --rank=$((i - 1)) --world=4 --aggregators="$agg_list" \
      --data-host="$(netbed_ip_of $i)" --epochs="$EPOCHS" --hidden="$HIDDEN" --batch="$BATCH" \
      --eval-every="$EVAL_EVERY" --optimizer="$OPTIMIZER" --gloo-init="tcp://$(netbed_ip_of 1):$((29500 + trial))" \
      "${extra[@]}" >"$work/$bed-$trial-$system.$i" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || true; done
  netbed_cross_stop
  local rows
  rows=$("$PYTHON" "$HERE/../scripts/netbed/worker_rows.py" "$work/$bed-$trial-$system" 4 "$system")
  "$PYTHON" - "$rows" "$bed" "$trial" "$system" <<'PY'
import json, sys
rows = json.loads(sys.argv[1])
if None in rows:
    sys.exit(0)
# The slowest worker's clock: the step is done when every worker is.
slowest = max(rows, key=lambda r: r["history"][-1][0])
print(json.dumps({"bed": sys.argv[2], "trial": int(sys.argv[3]), "system": sys.argv[4], "steps": slowest["steps"],
                  "history": rows[0]["history"], "train_s": slowest["history"][-1][0]}), flush=True)
PY
}

for bed in $BEDS; do
  for trial in $(seq 1 "$TRIALS"); do
    for system in dlcp_bounded dlcp_reliable gloo_ddp compute_only; do run "$bed" "$trial" "$system"; done
  done
done | tee "$work/results.jsonl"
"$PYTHON" "$HERE/tta_report.py" "$work/results.jsonl" --plot="$PLOT" \
  --setup="4 workers, digits CNN (hidden $HIDDEN, batch $BATCH, $OPTIMIZER), $RATE ports, MTU $MTU, $CROSS best-effort cross traffic into each worker port (bursty: $BURST-datagram bursts), ε = $EPS"
