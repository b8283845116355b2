#!/usr/bin/env bash
# Training under random loss (a lossy link, not a full queue): 4 workers on this host train the
# digits CNN (dlcp.examples.digits, first linear layer HIDDEN wide) through 2 local dlcpd with
# DistributedOptimizer at ε = EPS (0.1), once without loss and once with 10% of every droppable
# class's pushes dropped at the workers; beside them the lossy run with every loss read as
# congestion (--congestion-delay-us=0, as the window did before it looked at round trips), and DDP
# with Gloo's ring all-reduce without loss. TRIALS (2) interleaved trials. Prints one JSON line per
# run, then a table: training time (the slowest worker's), against dlcp's own loss-free run and
# against DDP, and final test accuracy. Needs torch and scikit-learn for PYTHON.
#   bench/random_loss_training.sh [BUILD_DIR]
set -euo pipefail
BUILD=$(cd "${1:-build}" && pwd)
TRIALS=${TRIALS:-2}
EPOCHS=${EPOCHS:-3}
HIDDEN=${HIDDEN:-1024}
BATCH=${BATCH:-8}
EPS=${EPS:-0.1}
PYTHON=${PYTHON:-/usr/bin/python3}
DROPS=1:0.1,2:0.1,3:0.1
"$PYTHON" -c "import torch, sklearn" 2>/dev/null || { echo "random_loss_training: needs torch and sklearn for $PYTHON" >&2; exit 1; }
source "$(dirname "$0")/loopback_lib.sh"
start_dlcpd a1
start_dlcpd a2

run() {  # trial system
  local trial=$1 system=$2 mode=dlcp pids=() i extra=() env=()
  case $system in
    dlcp_loss_free) extra=(--loss-bound="$EPS") ;;
    dlcp_random_loss) extra=(--loss-bound="$EPS" --inject-drop="$DROPS") ;;
    dlcp_random_loss_every_loss_cuts) extra=(--loss-bound="$EPS" --inject-drop="$DROPS"); env=(DLCP_CONGESTION_DELAY_US=0) ;;
    gloo_ddp) mode=gloo ;;
  esac
  for i in 0 1 2 3; do
    env PYTHONPATH="$BUILD/python" OMP_NUM_THREADS=1 "${env[@]}" timeout 900 "$PYTHON" -m dlcp.examples.digits \
      --json --plaintext --mode="$mode" --job="training-$trial-$system-$$" --rank=$i --world=4 \
      --aggregators="${AGG[a1]},${AGG[a2]}" --epochs="$EPOCHS" --hidden="$HIDDEN" --batch="$BATCH" \
      --gloo-init="tcp://127.0.0.1:$((29600 + trial))" "${extra[@]}" >"$BENCH_WORK/$trial-$system.$i" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || true; done
  "$PYTHON" - "$BENCH_WORK/$trial-$system" "$trial" "$system" <<'PY'
import json, sys
rows = []
for i in range(4):
    lines = [l for l in open(f"{sys.argv[1]}.{i}") if l.startswith("{")]
    rows.append(json.loads(lines[-1]) if lines else None)
if None in rows:
    print(json.dumps({"trial": int(sys.argv[2]), "system": sys.argv[3], "failed": True}), flush=True)
    sys.exit(0)
slowest = max(r["history"][-1][0] for r in rows)
print(json.dumps({"trial": int(sys.argv[2]), "system": sys.argv[3], "train_s": slowest,
                  "accuracy": rows[0]["history"][-1][1], "steps": rows[0]["steps"]}), flush=True)
PY
}

for trial in $(seq 1 "$TRIALS"); do
  for system in dlcp_loss_free dlcp_random_loss dlcp_random_loss_every_loss_cuts gloo_ddp; do run "$trial" "$system"; done
done | tee "$BENCH_WORK/training.jsonl"
"$PYTHON" - "$BENCH_WORK/training.jsonl" "$EPS" "$HIDDEN" "$EPOCHS" <<'PY'
import json, statistics, sys
runs = {}
for l in open(sys.argv[1]):
    r = json.loads(l)
    if not r.get("failed"):
        runs.setdefault(r["system"], []).append(r)
med = lambda system, key: statistics.median(r[key] for r in runs[system])
print(f"\n4 workers, digits CNN (hidden {sys.argv[3]}, {sys.argv[4]} epochs), 2 dlcpd on loopback, dlcp at ε = {sys.argv[2]},"
      " 10% random loss on classes 1-3 where named\n")
print("| system | runs | train s (median) | / dlcp loss-free | / DDP Gloo | final accuracy % | − loss-free, points |")
print("|---|---|---|---|---|---|---|")
for system in ("dlcp_loss_free", "dlcp_random_loss", "dlcp_random_loss_every_loss_cuts", "gloo_ddp"):
    if system not in runs:
        print(f"| {system} | 0 | - | - | - | - | - |"); continue
    t, acc = med(system, "train_s"), med(system, "accuracy")
    free = med("dlcp_loss_free", "train_s") if "dlcp_loss_free" in runs else float("nan")
    ddp = med("gloo_ddp", "train_s") if "gloo_ddp" in runs else float("nan")
    free_acc = med("dlcp_loss_free", "accuracy") if "dlcp_loss_free" in runs else float("nan")
    print(f"| {system} | {len(runs[system])} | {t:.1f} | {t / free:.2f} | {t / ddp:.2f} | {acc:.2f} | {acc - free_acc:+.2f} |")
PY
