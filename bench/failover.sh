#!/usr/bin/env bash
# What losing an aggregator costs a job with on_aggregator_loss=remap: the same job runs three
# times on three aggregators: undisturbed; with one of them SIGKILLed at KILL_S seconds; and with
# it stopped by SIGTERM (it drains: tells its workers, docs/failure-modes.md); each time restarted
# at its address at BACK_S. Prints each worker's JSON line and a ratio table: the job's wall time
# against the undisturbed run's, and the longest stall once the aggregator went (after a kill,
# detection plus regroup; after SIGTERM, the spread of the workers' heartbeats at most) and once
# it came back, and how long the aggregator took to go after the signal (the drain, for SIGTERM).
# Stalls under 100 ms count as none.
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
# Alive, and not yet a zombie waiting for this shell to reap it.
running() { kill -0 "$1" 2>/dev/null && [[ "$(ps -o stat= -p "$1")" != *Z* ]]; }
declare -A apid port
for i in 0 1 2; do start_agg $i 0; done
aggs="127.0.0.1:${port[0]},127.0.0.1:${port[1]},127.0.0.1:${port[2]}"

run_job() {  # run_job SCENARIO: the workers' JSON lines, tagged, into $work/rows
  local scenario=$1 wpids=() t0 t_gone=0 t_exit=0 t_back=0
  t0=$(date +%s.%N)
  for r in $(seq 0 $((WORKERS - 1))); do
    "$BUILD/bench/dlcp-bench" --plaintext --aggregators="$aggs" --workers="$WORKERS" --rank="$r" \
      --job="failover-$scenario" --tensor-bytes="$TENSOR" --rounds="$ROUNDS" --warmup=0 --loss-bound=0 \
      --on-aggregator-loss=remap >"$work/$scenario.$r.out" 2>"$work/$scenario.$r.err" &
    wpids+=($!)
  done
  if [ "$scenario" != steady ]; then
    sleep "$KILL_S"
    t_gone=$(date +%s.%N)
    if [ "$scenario" = killed ]; then kill -9 "${apid[1]}"; else kill -TERM "${apid[1]}"; fi
    # How long it took to go: a drain holds a rolling restart up for as long, on every node.
    # At most 20 s: the drain's own deadline (5 s) and shutdown (2 s) end well before.
    local until=$(($(date +%s) + 20))
    while running "${apid[1]}" && [ "$(date +%s)" -lt "$until" ]; do sleep 0.01; done
    t_exit=$(date +%s.%N)
    if running "${apid[1]}"; then echo "failover: aggregator 1 still runs 20 s after its signal ($scenario)" >&2; exit 1; fi
    sleep "$(awk -v a="$t_gone" -v b="$t_exit" -v s=$((BACK_S - KILL_S)) 'BEGIN { d = s - (b - a); print (d > 0 ? d : 0) }')"
    wait "${apid[1]}" 2>/dev/null || true  # its port is free again
    t_back=$(date +%s.%N)
    start_agg 1 "${port[1]}"
  fi
  for p in "${wpids[@]}"; do wait "$p" || { echo "failover: a worker failed ($scenario); see below" >&2; cat "$work/$scenario".*.err >&2; exit 1; }; done
  local wall; wall=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.3f", a - b }')
  for r in $(seq 0 $((WORKERS - 1))); do
    j=$(tail -1 "$work/$scenario.$r.out")
    regroups=$(grep -c "regrouped on" "$work/$scenario.$r.err" || true)
    echo "{\"scenario\":\"$scenario\",\"wall_s\":$wall,\"regroups\":$regroups,\"heartbeat_ms\":$HB_MS,\"t_gone\":$t_gone,\"t_exit\":$t_exit,\"t_back\":$t_back,${j#\{}" | tee -a "$work/rows"
  done
}
run_job steady
run_job killed
run_job drained
python3 - "$work/rows" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in rows: by.setdefault(r["scenario"], []).append(r)
steady, killed, drained = by["steady"], by["killed"], by["drained"]
hb = killed[0]["heartbeat_ms"]
print()
print("| | steady | SIGKILL | SIGTERM (drained) | SIGKILL / steady | SIGTERM / steady |")
print("|---|---|---|---|---|---|")
w = [s[0]["wall_s"] for s in (steady, killed, drained)]
print(f"| job wall time (s) | {w[0]:.2f} | {w[1]:.2f} | {w[2]:.2f} | {w[1] / w[0]:.2f} | {w[2] / w[0]:.2f} |")
# A stall mostly lands in the untimed barrier before a round (dlcp-bench times the all-reduce
# alone): the longest gap between the ends of consecutive rounds shows it, told apart by when it
# ended: after the aggregator went, or after it came back (each worker's probe of it comes up to a
# heartbeat interval apart, in either scenario).
def stall(rows, after, before):
    return max([ms for r in rows for (t, ms) in r["long_gaps"] if after < t <= before] + [0.0])
g = [max(r["max_gap_ms"] for r in s) for s in (steady, killed, drained)]
print(f"| longest gap between rounds (ms) | {g[0]:.1f} | {g[1]:.1f} | {g[2]:.1f} | | |")
lo = [stall(s, s[0]["t_gone"], s[0]["t_back"]) for s in (killed, drained)]
print(f"| stall once it went (ms) | | {lo[0]:.0f} | {lo[1]:.0f} | {lo[0] / hb:.2f} of the {hb} ms heartbeat deadline "
      f"| {lo[1] / hb:.2f} of it |")
ba = [stall(s, s[0]["t_back"], float("inf")) for s in (killed, drained)]
print(f"| stall once it came back (ms) | | {ba[0]:.0f} | {ba[1]:.0f} | | |")
x = [(s[0]["t_exit"] - s[0]["t_gone"]) * 1000 for s in (killed, drained)]
print(f"| aggregator gone after the signal (ms) | | {x[0]:.0f} | {x[1]:.0f} | | |")
m = [max(r["max_ms"] for r in s) for s in (steady, killed, drained)]
print(f"| longest timed round (ms) | {m[0]:.1f} | {m[1]:.1f} | {m[2]:.1f} | | |")
p = [max(r["p50_ms"] for r in s) for s in (steady, killed, drained)]
print(f"| p50 round (ms) | {p[0]:.2f} | {p[1]:.2f} | {p[2]:.2f} | {p[1] / p[0]:.2f} | {p[2] / p[0]:.2f} |")
g = [min(r["regroups"] for r in s) for s in (steady, killed, drained)]
print(f"| regroups per worker | {g[0]} | {g[1]} | {g[2]} | | |")
e = [all(r["exact"] for r in s) for s in (steady, killed, drained)]
print(f"| results exact | {e[0]} | {e[1]} | {e[2]} | | |")
PY
