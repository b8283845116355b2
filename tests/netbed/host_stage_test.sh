#!/usr/bin/env bash
# Host stages (docs/host-stage.md) on the emulated cluster: 2 hosts (w1, w2), each a network
# namespace with its own dlcpd (broker of its host stage and one of the job's two aggregators) and
# 3 dlcp-bench workers. Real binaries over UDP through the strict-priority switch. Asserts:
#   1. reliable: every worker's results exact, and each host's port carries at most 1.1 x the
#      tensor each way per round (read from its interface counters), where without stages it
#      carries 3 x;
#   2. bounded loss (ε = 0.05) with drops injected, through the stages: the bound held on every
#      round, results exact over their contributors, and each port carries at most 1.3 x the
#      tensor each way per round;
#   3. a local worker SIGKILLed: the other five fail naming its rank within 3 s;
#   4. w2's dlcpd SIGKILLed: its share moves to w1's, and every worker finishes exact;
#   5. a stage beyond dlcpd --host-shm-bytes: refused, every worker logs why naming the setting,
#      and results are exact over the network path.
# Needs root. Exits 77 (ctest: skipped) when it cannot run here.
#   tests/netbed/host_stage_test.sh BUILD_DIR
set -Eeuo pipefail
BUILD=$(cd "${1:-build}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
export PREFIX=${PREFIX:-dlcphs}
CLUSTER="$HERE/../../scripts/netbed/cluster.sh"
source "$HERE/../../scripts/netbed/session.sh"
netbed_skip_unless_able host_stage ip tc
netbed_start dlcp-host-stage
HOSTS="w1:$(netbed_ip_of 1) w2:$(netbed_ip_of 2)"
TENSOR=$((4 << 20))
fail=0
check() { if [[ $1 == 1 ]]; then echo "PASS: $2"; else echo "FAIL: $2"; fail=1; fi; }
# rounds_done: rounds w1's dlcpd has completed, over all jobs (dlcpctl stats).
rounds_done() {
  ip netns exec "$PREFIX-w1" "$BUILD/client/dlcpctl" stats --plaintext --aggregators="$(netbed_ip_of 1):7400" 2>/dev/null |
    awk '/dlcp_rounds_total\{outcome="completed"/ {n += $NF} END {print n + 0}'
}
# wait_rounds N: until w1's dlcpd has completed N more rounds than when asked (30 s at most).
wait_rounds() {
  local target=$(($(rounds_done) + $1)) _
  for _ in $(seq 1 300); do [[ $(rounds_done) -ge $target ]] && return 0; sleep 0.1; done
  return 1
}
wait_all() { local p ok=1; for p in "${worker_pids[@]}"; do wait "$p" || ok=0; done; [[ $ok == 1 ]]; }
all_exact() { local r; for r in 0 1 2 3 4 5; do grep -q '"exact":true' "$1.$r" || return 1; done; }

netbed_aggregators "$BUILD" "$HOSTS" --heartbeat-timeout-ms=1500 || exit 1

# 1. Reliable, with and without stages; bytes per round on each host's port, each way.
per_round() {  # NAME ROUNDS [flags...] -> "w1_tx w1_rx w2_tx w2_rx" in tensors per round
  local name=$1 rounds=$2 b1 b2 a1 a2
  shift 2
  b1=$(netbed_port_bytes w1) b2=$(netbed_port_bytes w2)
  netbed_host_workers "$BUILD" "$work/$name" 3 "$HOSTS" --job="$name" --tensor-bytes=$TENSOR --rounds="$rounds" \
    --warmup=0 --timeout-s=120 "$@"
  wait_all || echo "host_stage: a worker of $name failed"
  a1=$(netbed_port_bytes w1) a2=$(netbed_port_bytes w2)
  python3 -c "import sys; b=[int(x) for x in sys.argv[1].split()]; a=[int(x) for x in sys.argv[2].split()]; \
print(' '.join(f'{(y - x) / $rounds / $TENSOR:.3f}' for x, y in zip(b, a)))" "$b1 $b2" "$a1 $a2"
}
staged=$(per_round staged 10)
all_exact "$work/staged" && ok=1 || ok=0
check $ok "reliable through host stages: every worker's results exact"
python3 -c "import sys; sys.exit(0 if max(map(float, sys.argv[1].split())) <= 1.1 else 1)" "$staged" && ok=1 || ok=0
check $ok "each host's port carries at most 1.1 x the tensor each way per round (w1 tx rx, w2 tx rx: $staged)"
unstaged=$(per_round unstaged 10 --host-stage=false)
python3 -c "import sys; sys.exit(0 if min(map(float, sys.argv[1].split())) >= 2.5 else 1)" "$unstaged" && ok=1 || ok=0
check $ok "without host stages the ports carry about 3 x ($unstaged)"

# 2. Bounded loss under injected drops, through the stages.
bounded=$(per_round bounded 10 --loss-bound=0.05 --inject-drop-class=1:0.05,2:0.05,3:0.05)
ok=1
for r in 0 1 2 3 4 5; do
  grep -q '"bound_violations":0' "$work/bounded.$r" && grep -q '"exact":true' "$work/bounded.$r" || ok=0
done
check $ok "ε = 0.05 with drops injected: the bound held on every round, sums exact over their contributors"
python3 -c "import sys; sys.exit(0 if max(map(float, sys.argv[1].split())) <= 1.3 else 1)" "$bounded" && ok=1 || ok=0
check $ok "under the bound too, each host's port carries at most 1.3 x the tensor each way per round ($bounded)"

# 3. A local worker killed.
netbed_host_workers "$BUILD" "$work/kill" 3 "$HOSTS" --job=kill --tensor-bytes=$TENSOR --rounds=1000000 \
  --on-aggregator-loss=fail --timeout-s=120
wait_rounds 10 || echo "host_stage: the kill job ran no rounds"
kill -9 "${worker_pids[4]}"
killed=$(date +%s%N)
ok=1
for r in 0 1 2 3 5; do
  wait "${worker_pids[r]}" && ok=0
  took=$((($(date +%s%N) - killed) / 1000000))
  grep -q "worker rank 4" "$work/kill.$r" || { ok=0; echo "rank $r did not name rank 4:"; tail -2 "$work/kill.$r"; }
  [[ $took -le 3000 ]] || { ok=0; echo "rank $r took $took ms"; }
done
check $ok "a local worker SIGKILLed: the other five fail naming its rank within 3 s"

# 4. w2's dlcpd killed mid-job: its share moves to w1's; the stages run on.
netbed_host_workers "$BUILD" "$work/dlcpd" 3 "$HOSTS" --job=dlcpd --tensor-bytes=$TENSOR --rounds=200 --warmup=0 \
  --timeout-s=120
wait_rounds 10 || echo "host_stage: the dlcpd job ran no rounds"
kill -9 "${agg_pids[1]}"
wait_all && all_exact "$work/dlcpd" && ok=1 || ok=0
grep -q "regrouped on 1 aggregator" "$work/dlcpd.0" || ok=0
check $ok "w2's dlcpd SIGKILLed: its share moved to w1's, every worker finished exact"
netbed_stop_aggregators

# 5. A stage beyond the host's shared-memory bound: the network path, saying why.
netbed_aggregators "$BUILD" "$HOSTS" --host-shm-bytes=11534336 --host-slot-bytes=1048576 || exit 1
netbed_host_workers "$BUILD" "$work/refused" 3 "$HOSTS" --job=refused --tensor-bytes=$TENSOR --rounds=5 --timeout-s=120
wait_all && all_exact "$work/refused" && ok=1 || ok=0
for r in 0 1 2 3 4 5; do grep -q "no host stage.*dlcpd --host-shm-bytes=11534336" "$work/refused.$r" || ok=0; done
check $ok "a stage beyond --host-shm-bytes: every worker logs why and pushes its own, exact"

exit $fail
