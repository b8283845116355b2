#!/usr/bin/env bash
# The congested-cluster test: 4 workers and 1 aggregator in network namespaces behind an emulated
# switch whose ports are strict-priority DSCP queues (small drop-tail FIFOs) at RATE. The workers
# all-reduce 20 MiB per round through a real dlcpd while the 4-to-1 incast and best-effort UDP
# cross traffic into the aggregator's port make the switch drop packets. Asserts:
#   - every result is exactly the sum of the contributions it holds (dlcp-bench's digit check);
#   - no class-0 chunk is ever lost (checked per chunk by each worker);
#   - droppable loss is at most ε in every round, and no STOP reported more;
#   - the switch's own counters show that packets were really dropped.
# Needs root (namespaces, tc). Exits 77 (ctest: skipped) when it cannot run here.
#   tests/netbed/congested_test.sh BUILD_DIR
# Env: EPS (0.01), ROUNDS (4), RATE (1gbit), QLEN_PKTS (64); DUMP_STATS=1 also prints the
# aggregator's counters and worker 1's JSON.
set -Eeuo pipefail
BUILD=$(cd "${1:-build}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
CLUSTER="$HERE/../../scripts/netbed/cluster.sh"
export PREFIX=${PREFIX:-dlcpt}  # its namespaces; the cluster itself: scripts/netbed/session.sh
ROUNDS=${ROUNDS:-4}
EPS=${EPS:-0.01}
TENSOR=$((20 << 20))

source "$HERE/../../scripts/netbed/session.sh"
netbed_skip_unless_able netbed ip tc iperf3 ethtool
netbed_start dlcp-netbed
AGG=198.18.0.101

ip netns exec "$PREFIX-a1" "$BUILD/server/dlcpd" --host=$AGG --port=7400 --data-port=7500 --plaintext \
  --log-level=warning --ready-file="$work/a1.ready" 2>"$work/a1.log" &
netbed_wait_ready "$work/a1.ready" || { echo "netbed: dlcpd did not start"; cat "$work/a1.log"; exit 1; }

# Best-effort cross traffic into the aggregator's port, for longer than the job runs.
"$CLUSTER" cross w4 a1 300M 0 60 udp 5299 >"$work/cross.log" 2>&1 &

pids=()
for i in 1 2 3 4; do
  ip netns exec "$PREFIX-w$i" "$BUILD/bench/dlcp_bench/dlcp-bench" --plaintext --aggregators=$AGG:7400 --workers=4 \
    --rank=$((i - 1)) --job=netbed --data-host=198.18.0.$((10 + i)) --tensor-bytes=$TENSOR --chunk-bytes=1400 \
    --rounds="$ROUNDS" --warmup=1 --loss-bound="$EPS" --window-bytes=$((1 << 20)) --json \
    >"$work/w$i.json" 2>"$work/w$i.err" &
  pids+=($!)
done
fail=0
for i in 1 2 3 4; do
  if ! wait "${pids[i-1]}"; then echo "netbed: worker $i failed:"; tail -5 "$work/w$i.err"; fail=1; fi
done
"$CLUSTER" stats >"$work/stats.txt"
if [[ -n ${DUMP_STATS:-} ]]; then ip netns exec "$PREFIX-a1" "$BUILD/client/dlcpctl" stats --aggregators=$AGG:7400 --plaintext | grep -vE " 0$"; cat "$work"/w1.json | tail -1; fi
python3 - "$work" "$EPS" "$fail" <<'PY'
import json, re, sys
work, eps, fail = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
rows = []
for i in range(1, 5):
    lines = [l for l in open(f"{work}/w{i}.json") if l.startswith("{")]
    rows.append(json.loads(lines[-1]) if lines else None)
stats = open(f"{work}/stats.txt").read()
# Drop-tail drops happen in each class's leaf FIFO: handles 110 (DSCP 46, dlcp class 0), 120
# (34, class 1), 130 (18, class 2) and 140 (best effort: dlcp class 3 and the cross traffic).
by_queue = {}
for h, d in re.findall(r"qdisc pfifo (\d+): Sent \d+ bytes \d+ pkt \(dropped (\d+)", stats):
    by_queue[h] = by_queue.get(h, 0) + int(d)
dropped = sum(by_queue.values())
ok = not fail and all(rows)
print(f"netbed: switch dropped {dropped} packets (by leaf queue {by_queue})")
for i, r in enumerate(rows):
    if not r:
        print(f"  worker {i + 1}: no result"); continue
    print(f"  worker {i + 1}: p50 {r['p50_ms']} ms p99 {r['p99_ms']} ms, worst round lost {r['max_round_loss']:.5f},"
          f" class-0 left out {r['left_out_c0']}, bound violations {r['bound_violations']},"
          f" exact {r['exact']} (checked {r['checked']}), STOP p99 {r['stop_p99_ms']} ms")
    ok = ok and r["exact"] and r["checked"] and r["bound_violations"] == 0 and r["left_out_c0"] == 0 \
        and r["max_round_loss"] <= eps + 1e-12
checks = {"every worker exact, class 0 intact, loss within ε": ok, "the switch dropped packets": dropped > 0}
for k, v in checks.items():
    print(f"{'PASS' if v else 'FAIL'}: {k}")
sys.exit(0 if all(checks.values()) else 1)
PY
