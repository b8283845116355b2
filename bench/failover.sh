#!/usr/bin/env bash
# What losing an aggregator costs a job with on_aggregator_loss=remap: the same job runs four
# times on three aggregators: undisturbed; with one of them SIGKILLed at KILL_S seconds; with it
# frozen by SIGSTOP (as a node gone without resetting its connections: calls to it run to their
# deadline; killed before it comes back); and with it stopped by SIGTERM (it drains: tells its
# workers, docs/failure-modes.md); each time restarted at its address at BACK_S. Prints each
# worker's JSON line and a ratio table: the job's wall time against the undisturbed run's, and the
# longest stall once the aggregator went (after a kill or a freeze, detection plus regroup; after
# SIGTERM, the spread of the workers' heartbeats at most) and once it came back, and how long the
# aggregator took to go after the signal (the drain, for SIGTERM). Stalls under 100 ms count as
# none.
#   bench/failover.sh [BUILD_DIR]   (env: WORKERS=3 ROUNDS=3000 TENSOR=1048576 HB_MS=1500 KILL_S=2 BACK_S=6
#                                    SCENARIOS="killed frozen drained")
set -euo pipefail
BUILD=${1:-build}
WORKERS=${WORKERS:-3}
ROUNDS=${ROUNDS:-3000}
TENSOR=${TENSOR:-1048576}
HB_MS=${HB_MS:-1500}
KILL_S=${KILL_S:-2}
BACK_S=${BACK_S:-6}
SCENARIOS=${SCENARIOS:-killed frozen drained}  # after the undisturbed run
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
    "$BUILD/bench/dlcp_bench/dlcp-bench" --plaintext --aggregators="$aggs" --workers="$WORKERS" --rank="$r" \
      --job="failover-$scenario" --tensor-bytes="$TENSOR" --rounds="$ROUNDS" --warmup=0 --loss-bound=0 \
      --on-aggregator-loss=remap --progress >"$work/$scenario.$r.out" 2>"$work/$scenario.$r.err" &
    wpids+=($!)
  done
  # KILL_S counts from the first round's end (rank 0's progress bar): a stall before it, while
  # the workers still join, would fall outside every gap between rounds.
  local deadline=$(($(date +%s) + 30))
  until grep -qE '\] [1-9][0-9]*/' "$work/$scenario.0.err" || [ "$(date +%s)" -ge "$deadline" ]; do sleep 0.01; done
  if [ "$scenario" != steady ]; then
    sleep "$KILL_S"
    t_gone=$(date +%s.%N)
    case $scenario in
      killed) kill -9 "${apid[1]}" ;;
      frozen) kill -STOP "${apid[1]}" ;;
      *) kill -TERM "${apid[1]}" ;;
    esac
    # How long it took to go: a drain holds a rolling restart up for as long, on every node.
    # At most 20 s: the drain's own deadline (5 s) and shutdown (2 s) end well before.
    deadline=$(($(date +%s) + 20))
    while [ "$scenario" != frozen ] && running "${apid[1]}" && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.01; done
    t_exit=$(date +%s.%N)
    if [ "$scenario" != frozen ] && running "${apid[1]}"; then
      echo "failover: aggregator 1 still runs 20 s after its signal ($scenario)" >&2
      exit 1
    fi
    sleep "$(awk -v a="$t_gone" -v b="$t_exit" -v s=$((BACK_S - KILL_S)) 'BEGIN { d = s - (b - a); print (d > 0 ? d : 0) }')"
    if [ "$scenario" = frozen ]; then kill -9 "${apid[1]}"; kill -CONT "${apid[1]}" 2>/dev/null || true; fi
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
for scenario in $SCENARIOS; do run_job "$scenario"; done
python3 - "$work/rows" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {}
for r in rows: by.setdefault(r["scenario"], []).append(r)
names = {"steady": "steady", "killed": "SIGKILL", "frozen": "SIGSTOP (frozen)", "drained": "SIGTERM (drained)"}
names = {k: v for k, v in names.items() if k in by}
runs = [by[k] for k in names]
hurt = runs[1:]
hb = runs[1][0]["heartbeat_ms"]
print()
print("| | " + " | ".join(names.values()) + " | " + " | ".join(f"{n} / steady" for n in list(names.values())[1:]) + " |")
print("|---" * (1 + len(names) + len(hurt)) + "|")
def row(label, values, ratios=None, fmt="{:.2f}"):
    cells = [("" if v is None else fmt.format(v)) for v in values]
    cells += ratios if ratios is not None else [""] * len(hurt)
    print(f"| {label} | " + " | ".join(cells) + " |")
w = [s[0]["wall_s"] for s in runs]
row("job wall time (s)", w, [f"{x / w[0]:.2f}" for x in w[1:]])
# A stall mostly lands in the untimed barrier before a round (dlcp-bench times the all-reduce
# alone): the longest gap between the ends of consecutive rounds shows it, told apart by when it
# ended: after the aggregator went, or after it came back (each worker's probe of it comes up to a
# heartbeat interval apart, in every scenario).
def stall(rows, after, before):
    return max([ms for r in rows for (t, ms) in r["long_gaps"] if after < t <= before] + [0.0])
row("longest gap between rounds (ms)", [max(r["max_gap_ms"] for r in s) for s in runs], fmt="{:.1f}")
lo = [stall(s, s[0]["t_gone"], s[0]["t_back"]) for s in hurt]
row("stall once it went (ms)", [None] + lo, [f"{x / hb:.2f} of the {hb} ms heartbeat deadline" for x in lo], fmt="{:.0f}")
row("stall once it came back (ms)", [None] + [stall(s, s[0]["t_back"], float("inf")) for s in hurt], fmt="{:.0f}")
row("aggregator gone after the signal (ms)",
    [None] + [None if s[0]["scenario"] == "frozen" else (s[0]["t_exit"] - s[0]["t_gone"]) * 1000 for s in hurt],
    fmt="{:.0f}")
row("longest timed round (ms)", [max(r["max_ms"] for r in s) for s in runs], fmt="{:.1f}")
p = [max(r["p50_ms"] for r in s) for s in runs]
row("p50 round (ms)", p, [f"{x / p[0]:.2f}" for x in p[1:]])
row("regroups per worker", [min(r["regroups"] for r in s) for s in runs], fmt="{}")
row("results exact", [all(r["exact"] for r in s) for s in runs], fmt="{}")
PY
