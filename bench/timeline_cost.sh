#!/usr/bin/env bash
# What the timeline (client option timeline, DLCP_TIMELINE) costs a step, two ways in one run:
#  - end to end: the same jobs with and without it against one local dlcpd, interleaved (p50 round
#    time, on over off). On these shared 2-core machines this ratio moves by a few percent from
#    run to run either way, which is more than the timeline costs;
#  - on the I/O thread: timeline_bench's cost of one recorded event times the events a step
#    records (counted in the traces the jobs wrote), over the step's p50 time.
# The worst case is many small tensors (an event per op moment, many ops per step); a few large
# ones are the other end. Prints JSON lines and a table.   bench/timeline_cost.sh [BUILD_DIR]
set -euo pipefail
BUILD=${1:-build}
REPS=${REPS:-5}
source "$(dirname "$0")/loopback_lib.sh"
export EVENT_NS
EVENT_NS=$("$BUILD/bench/timeline_bench" --benchmark_format=json |
  python3 -c 'import json,sys; print(next(b["cpu_time"] for b in json.load(sys.stdin)["benchmarks"] if b["name"].endswith("_median")))')
echo "{\"timeline_event_ns\":$EVENT_NS}"
export TRACES=$BENCH_WORK
start_dlcpd agg
for rep in $(seq 1 "$REPS"); do
  for spec in "4 262144 64 30" "4 4194304 8 30" "2 104857600 1 10"; do
    read -r n size tensors rounds <<<"$spec"
    for mode in off on; do
      flags=()
      [ "$mode" = on ] && flags=(--timeline="$BENCH_WORK/timeline-$n-$size-$rep-%r.json")
      run_job agg "\"timeline\":\"$mode\"" --workers="$n" --tensor-bytes="$size" \
        --tensors="$tensors" --rounds="$rounds" --warmup=2 --loss-bound=0 "${flags[@]}"
    done
  done
done
# Every trace must have been closed with nothing dropped.
for f in "$BENCH_WORK"/timeline-*.json; do
  grep -q '"dropped_events":0' "$f" || { echo "$f dropped events or was not closed" >&2; exit 1; }
done
report timeline <<'PY'
import glob, os
event_ns = float(os.environ["EVENT_NS"])
header("workers", "tensors per round", "p50 ms, timeline off", "on", "on / off", "events per round per worker",
       "their cost on the I/O thread", "exact")
for (n, b), g in sorted(groups.items()):
    off, on = med(g["off"], "p50_ms"), med(g["on"], "p50_ms")
    rounds = g["on"][0]["rounds"] + 2  # the timed rounds and the two warm-up ones
    traces = glob.glob(os.path.join(os.environ["TRACES"], f"timeline-{n}-{b}-*-0.json"))
    events = statistics.median(open(t).read().count('"cat":"op"') for t in traces) / rounds
    share = events * event_ns / (on * 1e6)
    shape = f"{g['off'][0]['tensors']} x {b // 1024} KiB"
    row(n, shape, f"{off:.2f}", f"{on:.2f}", f"{on / off:.3f}", f"{events:.0f}", f"{100 * share:.2f}%",
        all(r["exact"] for r in g["off"] + g["on"]))
PY
