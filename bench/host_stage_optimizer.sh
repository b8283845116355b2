#!/usr/bin/env bash
# DistributedOptimizer's step time through a host stage: 4 workers on this host train the digits CNN
# (dlcp.examples.digits, first linear layer HIDDEN wide) with DistributedOptimizer and its default
# fusion, against one dlcpd, with host stages (the default: LOCAL_WORLD_SIZE=4, the dlcpd's host
# socket) and with host_stage=false, TRIALS (3) interleaved trials each, fresh processes every
# time. Prints one JSON line per run (the slowest worker's training time per step, and how many
# stages dlcpd formed for it), then a table of medians and ranges. The stage must not be slower.
# Needs torch and scikit-learn for PYTHON.
#   bench/host_stage_optimizer.sh [BUILD_DIR]
set -euo pipefail
BUILD=$(cd "${1:-build}" && pwd)
TRIALS=${TRIALS:-3}
EPOCHS=${EPOCHS:-1}
HIDDEN=${HIDDEN:-1024}
BATCH=${BATCH:-8}
PYTHON=${PYTHON:-/usr/bin/python3}
"$PYTHON" -c "import torch, sklearn" 2>/dev/null || { echo "host_stage_optimizer: needs torch and sklearn for $PYTHON" >&2; exit 1; }
source "$(dirname "$0")/loopback_lib.sh"
start_dlcpd host --host-socket="$BENCH_WORK/dlcpd.sock" --metrics-port=0

formed() {  # the stages dlcpd formed so far
  "$PYTHON" -c 'import sys, urllib.request
for l in urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics").read().decode().splitlines():
    if l.startswith("dlcp_host_stages_formed_total "): print(l.split()[1])' "${METRICS[host]}"
}

run() {  # trial system
  local trial=$1 system=$2 pids=() i stage=true before
  [ "$system" = dlcp_per_worker ] && stage=false
  before=$(formed)
  for i in 0 1 2 3; do
    env PYTHONPATH="$BUILD/python" OMP_NUM_THREADS=1 LOCAL_WORLD_SIZE=4 DLCP_HOST_SOCKET="$BENCH_WORK/dlcpd.sock" \
      DLCP_HOST_STAGE="$stage" timeout 900 "$PYTHON" -m dlcp.examples.digits --json --plaintext --mode=dlcp \
      --job="opt-$trial-$system-$$" --rank=$i --world=4 --aggregators="${AGG[host]}" --epochs="$EPOCHS" \
      --hidden="$HIDDEN" --batch="$BATCH" >"$BENCH_WORK/$trial-$system.$i" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || true; done
  "$PYTHON" - "$BENCH_WORK/$trial-$system" "$trial" "$system" "$before" "$(formed)" <<'PY'
import json, sys
path, trial, system, before, after = sys.argv[1:]
rows = []
for i in range(4):
    lines = [l for l in open(f"{path}.{i}") if l.startswith("{")]
    rows.append(json.loads(lines[-1]) if lines else None)
if None in rows:
    print(json.dumps({"trial": int(trial), "system": system, "failed": True}), flush=True)
    sys.exit(0)
slowest = max(r["history"][-1][0] for r in rows)
print(json.dumps({"trial": int(trial), "system": system, "train_s": slowest, "steps": rows[0]["steps"],
                  "step_ms": slowest / rows[0]["steps"] * 1e3, "accuracy": rows[0]["history"][-1][1],
                  "stages_formed": float(after) - float(before)}), flush=True)
PY
}

for trial in $(seq 1 "$TRIALS"); do
  for system in dlcp_host_stage dlcp_per_worker; do run "$trial" "$system"; done
done | tee "$BENCH_WORK/optimizer.jsonl"
"$PYTHON" - "$BENCH_WORK/optimizer.jsonl" "$HIDDEN" "$BATCH" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["system"], []).append(r)
print()
print(f"4 workers of one host, digits CNN (hidden {sys.argv[2]}, batch {sys.argv[3]}), DistributedOptimizer, default fusion")
print("| system | step ms, median (range) | / per-worker | accuracy | stages formed per run | runs failed |")
print("|---|---|---|---|---|---|")
ok = {s: [r for r in rs if not r.get("failed")] for s, rs in by.items()}
base = statistics.median(r["step_ms"] for r in ok["dlcp_per_worker"]) if ok.get("dlcp_per_worker") else float("nan")
for system in ("dlcp_host_stage", "dlcp_per_worker"):
    rs = ok.get(system, [])
    if not rs:
        print(f"| {system} | - | - | - | - | {len(by.get(system, []))} |")
        continue
    ms = [r["step_ms"] for r in rs]
    med = statistics.median(ms)
    print(f"| {system} | {med:.2f} ({min(ms):.2f}-{max(ms):.2f}) | {med / base:.2f} | {rs[0]['accuracy']:.2f}% "
          f"| {', '.join(str(int(r['stages_formed'])) for r in rs)} | {len(by[system]) - len(rs)} |")
PY
