#!/usr/bin/env bash
# Path spraying on the multipath test bed (scripts/netbed/multipath.sh), in one run: WORKERS (4)
# in one rack, AGGS (2) aggregators in the other, 2 spines between them hashed by L4 ports. Each
# scenario runs dlcp with spraying off (--spray-ports=1) and on (SPRAY ports), reliable (ε = 0):
#   - "half": path 2 at half the rate of path 1 (RATE and RATE/2): round time p50 and p99;
#   - "equal": both paths at RATE, no other traffic: rack-to-rack throughput against the sum of
#     the path rates (each worker pushes and pulls its tensors once per round, so a round moves
#     WORKERS x TENSORS x TENSOR bytes each way), and against what TCP moves both ways at once over the
#     same fabric (iperf3, 8 streams each way, w1 <-> a1): on a small machine the emulated
#     fabric's forwarding, not the shaped rate, can be the limit;
#   - "cross": both paths at RATE, and path 2 loaded by UDP cross traffic at CROSS Mbit/s (200)
#     in each direction, sent from spine 2 itself to every host of the rack on the other side,
#     so that it crosses that path's ports and no other: round time p50 and p99; its throughput
#     is against the path rates less the cross traffic. The cross traffic rides DSCP CROSS_DSCP
#     (46, the top class), which dlcp's classes cannot push aside: best-effort cross traffic
#     (CROSS_DSCP=0) waits behind every class but the lowest, and hardly slows dlcp at all.
# SCENARIOS ("half equal cross") picks which run.
# Which path each unsprayed flow takes depends on its ephemeral ports, so each configuration runs
# TRIALS times with fresh processes (fresh ports); the table gives the medians, and the p99 of
# every round of every trial pooled: each job hashes anew, so the pooled figure is what a fabric
# gives across jobs, the bad hashes included, where the median trial's p99 is one job's. Beside it,
# the mean of each job's first timed round, and the pooled p99 of the rounds after it: how much
# of the tail is a job settling its path shares. With 5 trials of 20 rounds, a pooled p99 is
# about the slowest round of all. Prints one JSON
# line per run (with the busiest spine's share of each direction's bytes and each spine port's
# drops during it), then a ratio table. Env: RATE (Mbit/s of path 1, 400), TENSOR, TENSORS, ROUNDS,
# WINDOW, SPRAY (16), TRIALS (3), MTU (1500) with CHUNK (1400; 8192 with MTU=9000), BENCH_FLAGS
# (more dlcp-bench flags, e.g. --reliable-fraction=1.0), DLCPD_FLAGS (more dlcpd flags), FAMILY
# (4; 6 runs the bed and the jobs over IPv6). Needs root.
#   bench/netbed_spray.sh [BUILD_DIR]
set -Eeuo pipefail
BUILD=$(cd "${1:-build}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
MP="$HERE/../scripts/netbed/multipath.sh"
export PREFIX=${PREFIX:-dlcps}  # its namespaces
RATE=${RATE:-400} # Mbit/s of path 1
ROUNDS=${ROUNDS:-20}
TENSOR=${TENSOR:-$((8 << 20))}
SPRAY=${SPRAY:-16}
WINDOW=${WINDOW:-262144}
TENSORS=${TENSORS:-1}  # all-reduced concurrently each round
TRIALS=${TRIALS:-3}
SCENARIOS=${SCENARIOS:-half equal cross}
CROSS=${CROSS:-200}          # Mbit/s of cross traffic per direction on path 2 ("cross")
CROSS_DSCP=${CROSS_DSCP:-46}
CHUNK=${CHUNK:-1400}  # payload bytes per datagram: 1400 fits MTU 1500; with MTU=9000, 8192
[[ $(id -u) == 0 ]] || { echo "netbed_spray: needs root" >&2; exit 1; }

CLUSTER="$MP"
source "$HERE/../scripts/netbed/session.sh"
WORKERS=${WORKERS:-4}
AGGS=${AGGS:-2}
export NAGGS=$AGGS PATHS=2 RATES="${RATE}mbit $((RATE / 2))mbit"
netbed_start dlcp-spray-bench  # each scenario reshapes path 2 (multipath.sh rate)

AGG_HOSTS=$(for ((i = 1; i <= AGGS; i++)); do printf 'a%d:%s ' "$i" "$("$MP" ip "a$i")"; done)
WORKER_HOSTS=$(for ((i = 1; i <= WORKERS; i++)); do printf 'w%d:%s ' "$i" "$("$MP" ip "w$i")"; done)

# Cross traffic on path 2 only: iperf3 from spine 2's own namespace, which has a route to each
# rack, to every host of the other rack (port 5400 + its index), CROSS Mbit/s in all per
# direction; cross_stop ends it.
cross_start() {
  local h i=0 n rate
  for h in $(for ((k = 1; k <= WORKERS; k++)); do echo "w$k"; done) $(for ((k = 1; k <= AGGS; k++)); do echo "a$k"; done); do
    i=$((i + 1))
    if [[ $h == w* ]]; then n=$WORKERS; else n=$AGGS; fi
    rate=$(python3 -c "print(f'{$CROSS / $n:.1f}M')")
    ip netns exec "$PREFIX-$h" iperf3 -s -p $((5400 + i)) >/dev/null 2>&1 &
    sleep 0.2
    ip netns exec "$PREFIX-s2" iperf3 -c "$("$MP" ip "$h")" -p $((5400 + i)) -u -b "$rate" -l $((${MTU:-1500} - 28)) \
      --dscp "$CROSS_DSCP" -t 600 >/dev/null 2>&1 &
  done
  sleep 1
}
cross_stop() { pkill -f "iperf3 .*-p 54[0-9][0-9]" 2>/dev/null || true; sleep 0.5; }

run() {  # SCENARIO SPRAY TRIAL: AGGS aggregators and WORKERS workers, one JSON line into results.jsonl
  local scenario=$1 spray=$2 trial=$3
  # shellcheck disable=SC2086
  netbed_aggregators "$BUILD" "$AGG_HOSTS" --transport=udp --spray-ports="$spray" ${DLCPD_FLAGS:-} || return 0
  [[ $scenario == cross ]] && cross_start
  "$MP" bytes >"$work/bytes.before"
  "$MP" drops >"$work/drops.before"
  # shellcheck disable=SC2086
  netbed_workers "$BUILD" "$work/$scenario-$spray" "$WORKER_HOSTS" --job="$scenario-$spray-$trial" --transport=udp \
    --spray-ports="$spray" --tensor-bytes="$TENSOR" --tensors="$TENSORS" --chunk-bytes="$CHUNK" --rounds="$ROUNDS" \
    --warmup=1 --loss-bound=0 --window-bytes="$WINDOW" --timeout-s=600 ${BENCH_FLAGS:-}
  "$MP" bytes >"$work/bytes.after"
  "$MP" drops >"$work/drops.after"
  [[ $scenario == cross ]] && cross_stop
  netbed_stop_aggregators
  local rows
  rows=$(python3 "$HERE/../scripts/netbed/worker_rows.py" "$work/$scenario-$spray" "$WORKERS" "$scenario spray $spray")
  python3 - "$rows" "$scenario" "$spray" "$trial" "$work" >>"$work/results.jsonl" <<'PY'
import json, sys
rows = json.loads(sys.argv[1])
if None in rows:
    sys.exit(0)
def counters(path):  # "s1 to_aggregators=N to_workers=M" per spine
    out = {}
    for line in open(path):
        spine, *kv = line.split()
        out[spine] = {k: int(v) for k, v in (f.split("=") for f in kv)}
    return out
def delta(name):
    before, after = counters(f"{sys.argv[5]}/{name}.before"), counters(f"{sys.argv[5]}/{name}.after")
    return {s: {d: after[s][d] - before[s][d] for d in after[s]} for s in after}
sent, dropped = delta("bytes"), delta("drops")
# Per direction, the busiest spine's share of the bytes both spines carried (0.5: even).
share = {d: round(max(v[d] for v in sent.values()) / max(1, sum(v[d] for v in sent.values())), 3)
         for d in ("to_aggregators", "to_workers")}
print(json.dumps({"scenario": sys.argv[2], "spray_ports": int(sys.argv[3]), "trial": int(sys.argv[4]),
                  "p50_ms": max(r["p50_ms"] for r in rows), "p99_ms": max(r["p99_ms"] for r in rows),
                  # The job's rounds: each ends with its slowest worker's.
                  "round_ms": [max(t) for t in zip(*(r["round_ms"] for r in rows))],
                  "retransmits": sum(r["retransmits"] for r in rows), "exact": all(r["exact"] for r in rows),
                  "busiest_spine_share": share, "spine_bytes": sent, "spine_drops": dropped}))
PY
  tail -1 "$work/results.jsonl"
}

for scenario in $SCENARIOS; do
  case $scenario in
    half) "$MP" rate 2 "$((RATE / 2))mbit" ;;
    equal | cross) "$MP" rate 2 "${RATE}mbit" ;;
    *) echo "netbed_spray: unknown scenario '$scenario' (half, equal, cross)" >&2; exit 2 ;;
  esac
  for ((t = 1; t <= TRIALS; t++)); do
    run "$scenario" 1 "$t"
    run "$scenario" "$SPRAY" "$t"
  done
done

# TCP both ways at once over the equal fabric: the mean of the two directions' goodput.
"$MP" rate 2 "${RATE}mbit"
ip netns exec "$PREFIX-a1" iperf3 -s -1 -p 5299 >/dev/null 2>&1 &
sleep 0.5
ip netns exec "$PREFIX-w1" iperf3 -c "$("$MP" ip a1)" -p 5299 -t 5 -P 8 --bidir -J >"$work/iperf.json" 2>/dev/null || true
tcp_bps=$(python3 -c '
import json, sys
try:
    e = json.load(open(sys.argv[1]))["end"]
    print((e["sum_received"]["bits_per_second"] + e["sum_received_bidir_reverse"]["bits_per_second"]) / 2)
except Exception:
    print(0)' "$work/iperf.json")
echo "{\"scenario\": \"equal\", \"tcp_bidir_mbps\": $(python3 -c "print(round($tcp_bps / 1e6, 1))")}"

python3 - "$work/results.jsonl" "$TENSOR" "$RATE" "$SPRAY" "$TENSORS" "$tcp_bps" "$WORKERS" "$AGGS" "$CROSS" <<'PY'
import json, statistics, sys
runs = {}
for r in map(json.loads, open(sys.argv[1])):
    runs.setdefault((r["scenario"], r["spray_ports"]), []).append(r)
def pooled_p99(v, skip=0):  # over every round of every trial (past each trial's first `skip`), nearest rank
    ms = sorted(x for r in v for x in r["round_ms"][skip:])
    return ms[min(len(ms) - 1, max(0, -(-99 * len(ms) // 100) - 1))] if ms else float("nan")
# A job's first timed round is often its slowest while the path shares settle: the p99 of the
# rest says how much of the pooled p99 that transient is.
rows = {k: {"p50_ms": statistics.median(r["p50_ms"] for r in v), "p99_ms": statistics.median(r["p99_ms"] for r in v),
            "pooled_p99_ms": pooled_p99(v), "later_p99_ms": pooled_p99(v, 1),
            "first_ms": statistics.mean(r["round_ms"][0] for r in v) if all(r["round_ms"] for r in v) else float("nan"),
            "exact": all(r["exact"] for r in v), "trials": len(v)}
        for k, v in runs.items()}
size, rate, spray, tensors = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
tcp = float(sys.argv[6])
workers, aggs, cross = int(sys.argv[7]), int(sys.argv[8]), sys.argv[9]
print(f"\n{workers} workers -> {aggs} aggregators over 2 ECMP paths, {tensors} x {size >> 20} MiB per round, reliable,"
      f" medians of {max(r['trials'] for r in rows.values())} trials;"
      f" half: {rate} + {rate // 2} Mbit/s, equal: {rate} + {rate} Mbit/s,"
      f" cross: {rate} + {rate} Mbit/s with {cross} Mbit/s of cross traffic each way on path 2")
print("| scenario | spraying | p50 ms | p99 ms | p99 / p99 off | p99 of all trials' rounds | / same off |"
      " first timed round, mean ms | p99 of the rounds after it | rack throughput / sum of path rates | / TCP both ways | exact |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for scenario in ("half", "equal", "cross"):
    if not any(k[0] == scenario for k in rows):
        continue
    off = rows.get((scenario, 1))
    path_sum = rate * {"half": 1.5, "equal": 2, "cross": 2 - int(cross) / rate}[scenario] * 1e6
    for ports in (1, spray):
        r = rows.get((scenario, ports))
        if not r:
            print(f"| {scenario} | {ports} ports | - | - | - | - | - | - | - | - | - | failed |"); continue
        ratio = f"{r['p99_ms'] / off['p99_ms']:.2f}" if off else "-"
        pooled_ratio = f"{r['pooled_p99_ms'] / off['pooled_p99_ms']:.2f}" if off else "-"
        tput = workers * tensors * size * 8 / (r["p50_ms"] / 1000) / path_sum
        label = "off" if ports == 1 else f"{ports} ports"
        vs_tcp = f"{tput * path_sum / tcp:.2f}" if scenario == "equal" and tcp > 0 else "-"
        print(f"| {scenario} | {label} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {ratio} | {r['pooled_p99_ms']:.1f}"
              f" | {pooled_ratio} | {r['first_ms']:.1f} | {r['later_p99_ms']:.1f} | {tput:.2f} | {vs_tcp} | {r['exact']} |")
if tcp > 0:
    print(f"TCP, 8 streams each way at once over the equal fabric: {tcp / 1e6:.0f} Mbit/s per direction"
          f" ({tcp / (2 * rate * 1e6):.2f} of the path sum)")
PY
