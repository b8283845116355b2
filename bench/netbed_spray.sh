#!/usr/bin/env bash
# Path spraying on the multipath test bed (scripts/netbed/multipath.sh), in one run: 4 workers in
# one rack, 2 aggregators in the other, 2 spines between them hashed by L4 ports (ECMP). Each
# scenario runs dlcp with spraying off (--spray-ports=1) and on (SPRAY ports), reliable (ε = 0):
#   - "half": path 2 at half the rate of path 1 (RATE and RATE/2): round time p50 and p99;
#   - "equal": both paths at RATE, no other traffic: rack-to-rack throughput against the sum of
#     the path rates (each worker pushes and pulls its tensors once per round, so a round moves
#     4 x TENSORS x TENSOR bytes each way).
# Prints one JSON line per run, then a ratio table. Needs root.
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
[[ $(id -u) == 0 ]] || { echo "netbed_spray: needs root" >&2; exit 1; }

CLUSTER="$MP"
source "$HERE/../scripts/netbed/session.sh"
export NAGGS=2 PATHS=2 RATES="${RATE}mbit $((RATE / 2))mbit"
netbed_start dlcp-spray-bench  # the "half" scenario first

run() {  # SCENARIO SPRAY: 2 aggregators and 4 workers, one JSON line into results.jsonl
  local scenario=$1 spray=$2 i aggs=() pids=()
  for i in 1 2; do
    rm -f "$work/a$i.ready"
    ip netns exec "$PREFIX-a$i" "$BUILD/server/dlcpd" --host="$("$MP" ip a$i)" --port=7400 --data-port=7500 \
      --plaintext --transport=udp --spray-ports="$spray" --log-level=warning --ready-file="$work/a$i.ready" \
      2>"$work/a$i.log" &
    aggs+=("$("$MP" ip a$i):7400")
  done
  for i in 1 2; do netbed_wait_ready "$work/a$i.ready" || echo "netbed_spray: dlcpd on a$i did not start" >&2; done
  local list; list=$(IFS=,; echo "${aggs[*]}")
  for i in 1 2 3 4; do
    ip netns exec "$PREFIX-w$i" "$BUILD/bench/dlcp-bench" --plaintext --aggregators="$list" --workers=4 \
      --rank=$((i - 1)) --job="$scenario-$spray" --data-host="$("$MP" ip w$i)" --transport=udp --spray-ports="$spray" \
      --tensor-bytes="$TENSOR" --tensors="$TENSORS" --chunk-bytes=1400 --rounds="$ROUNDS" --warmup=1 --loss-bound=0 \
      --window-bytes="$WINDOW" --timeout-s=600 --json >"$work/$scenario-$spray.$i" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || true; done
  pkill -f "$BUILD/server/dlcpd --host=$("$MP" ip a1 | cut -d. -f1-2)" 2>/dev/null || true
  sleep 0.5
  python3 - "$work/$scenario-$spray" "$scenario" "$spray" >>"$work/results.jsonl" <<'PY'
import json, sys
rows = []
for i in range(1, 5):
    text = open(f"{sys.argv[1]}.{i}").read().splitlines()
    js = [l for l in text if l.startswith("{")]
    if not js:
        print(f"{sys.argv[2]} spray {sys.argv[3]} worker {i} failed:", *text[-3:], sep="\n  ", file=sys.stderr)
        sys.exit(0)
    rows.append(json.loads(js[-1]))
print(json.dumps({"scenario": sys.argv[2], "spray_ports": int(sys.argv[3]),
                  "p50_ms": max(r["p50_ms"] for r in rows), "p99_ms": max(r["p99_ms"] for r in rows),
                  "retransmits": sum(r["retransmits"] for r in rows), "exact": all(r["exact"] for r in rows)}))
PY
  tail -1 "$work/results.jsonl"
}

for scenario in half equal; do
  if [[ $scenario == equal ]]; then
    export RATES="${RATE}mbit ${RATE}mbit"
    "$MP" up >/dev/null
  fi
  run "$scenario" 1
  run "$scenario" "$SPRAY"
done

python3 - "$work/results.jsonl" "$TENSOR" "$RATE" "$SPRAY" "$TENSORS" <<'PY'
import json, sys
rows = {(r["scenario"], r["spray_ports"]): r for r in map(json.loads, open(sys.argv[1]))}
size, rate, spray, tensors = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
print(f"\n4 workers -> 2 aggregators over 2 ECMP paths, {tensors} x {size >> 20} MiB per round, reliable;"
      f" half: {rate} + {rate // 2} Mbit/s, equal: {rate} + {rate} Mbit/s")
print("| scenario | spraying | p50 ms | p99 ms | p99 / p99 off | rack throughput / sum of path rates | exact |")
print("|---|---|---|---|---|---|---|")
for scenario in ("half", "equal"):
    off = rows.get((scenario, 1))
    path_sum = rate * (1.5 if scenario == "half" else 2) * 1e6
    for ports in (1, spray):
        r = rows.get((scenario, ports))
        if not r:
            print(f"| {scenario} | {ports} ports | - | - | - | - | failed |"); continue
        ratio = f"{r['p99_ms'] / off['p99_ms']:.2f}" if off else "-"
        tput = 4 * tensors * size * 8 / (r["p50_ms"] / 1000) / path_sum
        label = "off" if ports == 1 else f"{ports} ports"
        print(f"| {scenario} | {label} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {ratio} | {tput:.2f} | {r['exact']} |")
PY
