#!/usr/bin/env bash
# What losing an aggregator costs a job with on_aggregator_loss=remap: the same job runs twice on
# three aggregators, once undisturbed and once with one of them SIGKILLed at KILL_S seconds and
# restarted at its address at BACK_S. Prints each worker's JSON line and a ratio table: the
# longest round against the heartbeat deadline (the stall is detection plus regroup), and the
# job's wall time against the undisturbed run's.
#   bench/failover.sh [BUILD_DIR]   (env: WORKERS=3 ROUNDS=3000 TENSOR=1048576 HB_MS=1500 KILL_S=2 BACK_S=6)
set -euo pipefail
BUILD=${1:-build}
WORKERS=${WORKERS:-3}
ROUNDS=${ROUNDS:-3000}
TENSOR=${TENSOR:-1048576}
HB_MS=${HB_MS:-1500}
KILL_S=${KILL_S:-2}
BACK_S=${BACK_S:-6}
work=$(mktemp -d /tmp/dlcp-failover.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

start_agg() {  # start_agg INDEX PORT
  rm -f "$work/a$1.ready"
  "$BUILD/server/dlcpd" --host=127.0.0.1 --port="$2" --data-port=0 --plaintext --log-level=warning \
    --heartbeat-timeout-ms="$HB_MS" --ready-file="$work/a$1.ready" 2>>"$work/a$1.log" &
  apid[$1]=$!
  pids+=($!)
  for _ in $(seq 1 200); do [ -s "$work/a$1.ready" ] && break; sleep 0.05; done
  port[$1]=$(sed -E 's/.*"control_port":([0-9]+).*/\1/' "$work/a$1.ready")
}
declare -A apid port
for i in 0 1 2; do start_agg $i 0; done
aggs="127.0.0.1:${port[0]},127.0.0.1:${port[1]},127.0.0.1:${port[2]}"

run_job() {  # run_job SCENARIO: the workers' JSON lines, tagged, into $work/rows
  local scenario=$1 wpids=() t0
  t0=$(date +%s.%N)
  for r in $(seq 0 $((WORKERS - 1))); do
    "$BUILD/bench/dlcp-bench" --plaintext --aggregators="$aggs" --workers="$WORKERS" --rank="$r" \
      --job="failover-$scenario" --tensor-bytes="$TENSOR" --rounds="$ROUNDS" --warmup=0 --loss-bound=0 \
      --on-aggregator-loss=remap >"$work/$scenario.$r.out" 2>"$work/$scenario.$r.err" &
    wpids+=($!)
  done
  if [ "$scenario" = failover ]; then
    sleep "$KILL_S"; kill -9 "${apid[1]}"
    sleep $((BACK_S - KILL_S)); start_agg 1 "${port[1]}"
  fi
  for p in "${wpids[@]}"; do wait "$p" || { echo "failover: a worker failed ($scenario); see below" >&2; cat "$work/$scenario".*.err >&2; exit 1; }; done
  local wall; wall=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.3f", a - b }')
  for r in $(seq 0 $((WORKERS - 1))); do
    j=$(tail -1 "$work/$scenario.$r.out")
    regroups=$(grep -c "regrouped on" "$work/$scenario.$r.err" || true)
    echo "{\"scenario\":\"$scenario\",\"wall_s\":$wall,\"regroups\":$regroups,\"heartbeat_ms\":$HB_MS,${j#\{}" | tee -a "$work/rows"
  done
}
run_job steady
run_job failover
python3 - "$work/rows" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in rows: by.setdefault(r["scenario"], []).append(r)
steady, fail = by["steady"], by["failover"]
hb = fail[0]["heartbeat_ms"]
print()
print("| | steady | failover | ratio |")
print("|---|---|---|---|")
sw, fw = steady[0]["wall_s"], fail[0]["wall_s"]
print(f"| job wall time (s) | {sw:.2f} | {fw:.2f} | {fw / sw:.2f} |")
sm, fm = max(r["max_ms"] for r in steady), max(r["max_ms"] for r in fail)
print(f"| longest round (ms) | {sm:.1f} | {fm:.1f} | {fm / hb:.2f} of the {hb} ms heartbeat deadline |")
sp, fp = max(r["p50_ms"] for r in steady), max(r["p50_ms"] for r in fail)
print(f"| p50 round (ms) | {sp:.2f} | {fp:.2f} | {fp / sp:.2f} |")
print(f"| regroups per worker | {min(r['regroups'] for r in steady)} | {min(r['regroups'] for r in fail)} | |")
print(f"| results exact | {all(r['exact'] for r in steady)} | {all(r['exact'] for r in fail)} | |")
PY
