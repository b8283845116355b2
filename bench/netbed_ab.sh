#!/usr/bin/env bash
# One dlcp setting against another on the emulated cluster, in interleaved runs: A, B, A, B, ...
# so that both see the same machine (these 2 cores are shared and noisy; compare side by side).
#   BED=switch (default): scripts/netbed/cluster.sh, 4 workers with a dlcpd on each, 20 MiB
#     rounds; CROSS (e.g. 300M) adds best-effort cross traffic into every worker's port.
#   BED=incast: the same switch, one dlcpd on its own host (a1) for all 4 workers, 20 MiB rounds:
#     the 4-to-1 incast of tests/netbed/congested_test.sh, which overruns a1's port queues
#     without any other traffic; CROSS (e.g. 300M) adds best-effort cross traffic into that port.
#   BED=spines: scripts/netbed/multipath.sh, 4 workers in one rack, 2 aggregators in the other,
#     2 spines at SPINE_MBIT Mbit/s (400) and SPINE2_MBIT (the same), 8 MiB rounds, spraying
#     on; each run's JSON adds the packets each spine's ports dropped, towards the aggregators
#     (pushes) and towards the workers (results), and the busier spine's share of the bytes
#     each way (0.5: an even split).
# A_FLAGS and B_FLAGS go to every dlcp-bench, A_DFLAGS and B_DFLAGS to every dlcpd; B_BUILD (a
# build directory) runs B from another build, to compare a change with the code before it. PAIRS (3),
# ROUNDS (10), LB (ε, 0), MTU (1500) with CHUNK (1400; 8192 with MTU=9000). STRAGGLE=STOP:EVERY
# (ms, e.g. 60:400) makes the last worker a straggler: stopped (SIGSTOP) for STOP every EVERY, as a
# peer whose step ran long. Prints one JSON line per run (the slowest worker's p50 and p99, chunks
# pushed again), then medians and B / A.
# Needs root.
#   A_FLAGS=--pacing=true B_FLAGS=--pacing=false MTU=9000 bench/netbed_ab.sh [BUILD_DIR]
set -Eeuo pipefail
BUILD=$(cd "${1:-build}" && pwd)
B_BUILD=$(cd "${B_BUILD:-$BUILD}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
BED=${BED:-switch}
export PREFIX=${PREFIX:-dlcpab}
export MTU=${MTU:-1500}
CHUNK=${CHUNK:-$([[ $MTU -ge 9000 ]] && echo 8192 || echo 1400)}
PAIRS=${PAIRS:-3}
ROUNDS=${ROUNDS:-10}
[[ $(id -u) == 0 ]] || { echo "netbed_ab: needs root" >&2; exit 1; }
case $BED in
  switch | incast) CLUSTER="$HERE/../scripts/netbed/cluster.sh" ;;
  spines) CLUSTER="$HERE/../scripts/netbed/multipath.sh" ;;
  *) echo "netbed_ab: BED must be switch, incast or spines" >&2; exit 2 ;;
esac
SPINE_MBIT=${SPINE_MBIT:-400}
SPINE2_MBIT=${SPINE2_MBIT:-$SPINE_MBIT}
source "$HERE/../scripts/netbed/session.sh"
if [[ $BED == spines ]]; then
  export NAGGS=2 PATHS=2 RATES="${SPINE_MBIT}mbit ${SPINE2_MBIT}mbit"
  TENSOR=$((8 << 20))
else
  TENSOR=$((20 << 20))
fi
netbed_start dlcp-netbed-ab
if [[ $BED == spines ]]; then
  AGG_HOSTS="a1:$("$CLUSTER" ip a1) a2:$("$CLUSTER" ip a2)"
  WORKER_HOSTS=$(for i in 1 2 3 4; do printf 'w%d:%s ' "$i" "$("$CLUSTER" ip "w$i")"; done)
elif [[ $BED == incast ]]; then
  AGG_HOSTS="a1:198.18.0.101"  # cluster.sh's first aggregator host
  WORKER_HOSTS=$(netbed_worker_hosts)
else
  AGG_HOSTS=$(netbed_worker_hosts)
  WORKER_HOSTS=$AGG_HOSTS
fi

straggle() {  # JOB: stops the job's last worker for STOP ms every EVERY ms (STRAGGLE), until it exits
  local stop every pid="" i
  stop=$(awk -v v="${STRAGGLE%%:*}" 'BEGIN { print v / 1000 }')
  every=$(awk -v v="${STRAGGLE#*:}" 'BEGIN { print v / 1000 }')
  for ((i = 0; i < 100 && ${#pid} == 0; i++)); do
    pid=$(pgrep -f -- "--rank=3 .*--job=$1 " | head -1) || sleep 0.1
  done
  [[ -n $pid ]] || { echo "netbed_ab: no worker of $1 to stop" >&2; return 1; }
  while sleep "$every" && kill -STOP "$pid" 2>/dev/null; do
    sleep "$stop"
    kill -CONT "$pid" 2>/dev/null || break
  done
}

run() {  # LABEL BUILD BENCH_FLAGS DLCPD_FLAGS: one JSON line into $work/runs.jsonl
  local label=$1 build=$2 flags=$3 dflags=$4 drops_before="" bytes_before=""
  [[ $BED == spines ]] && drops_before=$("$CLUSTER" drops) && bytes_before=$("$CLUSTER" bytes)
  # shellcheck disable=SC2086
  netbed_aggregators "$build" "$AGG_HOSTS" --transport=udp $dflags || exit 1
  [[ -n ${CROSS:-} && $BED == switch ]] && netbed_cross_start 300
  if [[ -n ${CROSS:-} && $BED == incast ]]; then  # into a1's port; netbed_cross_stop ends it too
    "$CLUSTER" cross w4 a1 "$CROSS" 0 300 udp 5300 >/dev/null 2>&1 &
    sleep 1
  fi
  local job="ab-$label-$RANDOM" stopper=""
  if [[ -n ${STRAGGLE:-} ]]; then
    straggle "$job" &
    stopper=$!
  fi
  # shellcheck disable=SC2086
  netbed_workers "$build" "$work/w" "$WORKER_HOSTS" --job="$job" --transport=udp \
    --tensor-bytes="$TENSOR" --chunk-bytes="$CHUNK" --rounds="$ROUNDS" --warmup=1 --loss-bound="${LB:-0}" \
    --timeout-s=600 $flags
  [[ -n $stopper ]] && { kill "$stopper" 2>/dev/null; wait "$stopper" 2>/dev/null || true; }
  [[ -n ${CROSS:-} && $BED != spines ]] && netbed_cross_stop
  netbed_stop_aggregators
  rows=$(python3 "$HERE/../scripts/netbed/worker_rows.py" "$work/w" 4 "netbed_ab $label")
  local drops_after="" bytes_after=""
  [[ $BED == spines ]] && drops_after=$("$CLUSTER" drops) && bytes_after=$("$CLUSTER" bytes)
  python3 - "$rows" "$label" "$drops_before" "$drops_after" "$bytes_before" "$bytes_after" >>"$work/runs.jsonl" <<'PY'
import json, sys
rows = json.loads(sys.argv[1])
if None in rows:
    sys.exit(0)
out = {"setting": sys.argv[2], "p50_ms": max(r["p50_ms"] for r in rows),
       "p99_ms": max(r["p99_ms"] for r in rows), "retransmits": sum(r["retransmits"] for r in rows),
       "exact": all(r["exact"] for r in rows),
       "round_ms": [round(max(t), 1) for t in zip(*(r["round_ms"] for r in rows))]}  # the job's, in order
def parse(text):  # "s1 to_aggregators=N to_workers=M" per line
    return {f"{l.split()[0]}_{k}": int(v) for l in text.splitlines() for k, v in (f.split("=") for f in l.split()[1:])}
if sys.argv[4]:
    before, after = parse(sys.argv[3]), parse(sys.argv[4])
    out["drops"] = {k: after[k] - before.get(k, 0) for k in after}
if sys.argv[6]:  # the busier spine's share of each direction's bytes: 0.5 is an even split
    before, after = parse(sys.argv[5]), parse(sys.argv[6])
    sent = {k: after[k] - before.get(k, 0) for k in after}
    out["busiest_spine_share"] = {
        d: round(max(sent[f"s1_{d}"], sent[f"s2_{d}"]) / max(1, sent[f"s1_{d}"] + sent[f"s2_{d}"]), 3)
        for d in ("to_aggregators", "to_workers")}
print(json.dumps(out))
PY
  tail -1 "$work/runs.jsonl"
}

for ((k = 1; k <= PAIRS; k++)); do
  run A "$BUILD" "${A_FLAGS:-}" "${A_DFLAGS:-}"
  run B "$B_BUILD" "${B_FLAGS:-}" "${B_DFLAGS:-}"
done

python3 - "$work/runs.jsonl" "$BED" "$MTU" "${A_FLAGS:-} ${A_DFLAGS:-}" \
  "$([[ $B_BUILD != "$BUILD" ]] && echo "$B_BUILD:") ${B_FLAGS:-} ${B_DFLAGS:-}" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
print(f"\n{sys.argv[2]} bed, MTU {sys.argv[3]}; A: {sys.argv[4].strip() or 'defaults'}; B: {sys.argv[5].strip() or 'defaults'}")
print("| setting | runs | p50 ms (median) | p99 ms (median) | chunks pushed again (median) | exact |")
print("|---|---|---|---|---|---|")
med = {}
for s in ("A", "B"):
    r = [x for x in runs if x["setting"] == s]
    if not r:
        print(f"| {s} | 0 | - | - | - | failed |"); continue
    med[s] = {k: statistics.median(x[k] for x in r) for k in ("p50_ms", "p99_ms", "retransmits")}
    print(f"| {s} | {len(r)} | {med[s]['p50_ms']:.1f} | {med[s]['p99_ms']:.1f} | {med[s]['retransmits']:.0f} | {all(x['exact'] for x in r)} |")
if len(med) == 2:
    print(f"B / A: p50 {med['B']['p50_ms'] / med['A']['p50_ms']:.2f}, p99 {med['B']['p99_ms'] / med['A']['p99_ms']:.2f}")
PY
