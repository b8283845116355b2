#!/usr/bin/env bash
# Path spraying over RDMA on a multipath fabric (docs/path-spraying.md): real RoCEv2
# packets from Soft-RoCE cross the two-spine test bed of scripts/netbed/multipath.sh, whose
# leaves hash each packet's 5-tuple onto a spine. A RoCEv2 packet's destination port is always
# 4791 and its source port comes from its queue pair, so the only thing a sender can vary to
# change its path is the queue pair it sends on.
#
#   worker VM ── tap ── [worker rack] ══ spine 1 ══ [aggregator rack] ── tap ── aggregator VM
#                                     ══ spine 2 ══
#
# Two qemu VMs (tests/rdma-vm/rxevm.sh --nic, TCG: about 10 s each to boot) stand for the two
# racks' hosts: the aggregator VM runs dlcpd pairs (--transport=rdma), the worker VM runs
# dlcp-bench with 2 workers against them, reliable (ε = 0) rounds checked exact. Settings:
#   - sprayed:     16 queue pairs per endpoint, path-aware windows and result steering (default);
#   - unsteered:   16 queue pairs, equal turns (--path-steering=false, --result-steering=false);
#   - unsprayed:   1 queue pair per endpoint (--spray-ports=1): each flow hashes onto one spine.
# Scenarios: "equal" (both spines at RATE) and "half" (spine 2 at half of RATE). Trials run
# interleaved. The host reads the spines' byte and drop counters around every run.
#
# Prints one JSON line per run (with the aggregators' results sent, sent again on request, and
# requests not answered because the copy may still arrive), then a table of medians and ratios.
# Under TCG the VMs' CPUs, not only the spines, limit the rounds: compare the settings with each
# other, not with the rate.
# Env: RATE (10mbit), TENSOR (1000000 bytes per worker per round), ROUNDS (8), TRIALS (2),
# SCENARIOS ("equal half"), BENCH_FLAGS (more dlcp-bench flags for every run). Needs root and qemu.
#   bench/rdma_multipath.sh [BUILD_DIR]
set -Eeuo pipefail
BUILD=$(cd "${1:-build}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
RXEVM="$HERE/../tests/rdma-vm/rxevm.sh"
MP="$HERE/../scripts/netbed/multipath.sh"
RATE=${RATE:-10mbit}
TENSOR=${TENSOR:-1000000}
ROUNDS=${ROUNDS:-8}
TRIALS=${TRIALS:-2}
SCENARIOS=${SCENARIOS:-"equal half"}
export PREFIX=${RMP_PREFIX:-rmp} NWORKERS=1 NAGGS=1 PATHS=2 NET=10.73 RATES=$RATE STATE_DIR=/tmp/rdma-multipath
[[ $(id -u) == 0 ]] || { echo "rdma_multipath: needs root" >&2; exit 1; }
command -v qemu-system-x86_64 >/dev/null || { echo "rdma_multipath: needs qemu-system-x86_64 (scripts/install-deps.sh)" >&2; exit 1; }
[[ $RATE =~ ^([0-9]+)mbit$ ]] || { echo "rdma_multipath: RATE must be in mbit, e.g. 10mbit" >&2; exit 1; }
HALF="$(( BASH_REMATCH[1] / 2 ))mbit"
for b in server/dlcpd bench/dlcp_bench/dlcp-bench; do [[ -x $BUILD/$b ]] || { echo "rdma_multipath: $BUILD/$b is missing" >&2; exit 1; }; done

work=$(mktemp -d /tmp/rdma-multipath.XXXXXX)
WIP=$("$MP" ip w1) AIP=$("$MP" ip a1)
cleanup() {
  ip netns exec "$PREFIX-la" timeout 5 bash -c "echo done > /dev/tcp/$AIP/7999" 2>/dev/null || true
  jobs -p | xargs -r kill 2>/dev/null || true
  pkill -f -- "$work/rxevm" 2>/dev/null || true  # a VM that outlived its script (TMPDIR below)
  wait 2>/dev/null || true
  "$MP" down >/dev/null 2>&1 || true
  [[ -n ${KEEP_WORK:-} ]] && echo "rdma_multipath: kept $work" >&2 || rm -rf "$work"
}
trap cleanup EXIT

# The fabric, with each rack's one host namespace turned into a bridge between its uplink and a
# tap device for a VM, which takes over the host's address.
"$MP" up >/dev/null
for h in w1 a1; do
  n=$PREFIX-$h
  ip -n "$n" tuntap add dev vmtap mode tap
  ip -n "$n" addr flush dev eth0
  ip -n "$n" link add br0 type bridge stp_state 0
  ip -n "$n" link set eth0 master br0
  ip -n "$n" link set vmtap master br0
  ip -n "$n" link set vmtap up
  ip -n "$n" link set br0 up
done

# Aggregator VM: a dlcpd pair per setting (control ports 7101-7106), until the host says done.
cat > "$work/aggregators.sh" <<EOF
B=$BUILD
start() {
  p=\$1; shift
  \$B/server/dlcpd --plaintext --transport=rdma --port=\$p --metrics-port=\$((p + 1000)) --ready-file=/tmp/\$p.ready "\$@" > /rxevm/out/agg\$p.log 2>&1 &
}
for p in 7101 7102; do start \$p; done
for p in 7103 7104; do start \$p --result-steering=false; done
for p in 7105 7106; do start \$p --spray-ports=1; done
i=0; while [ \$(ls /tmp/*.ready 2>/dev/null | wc -l) -lt 6 ] && [ \$i -lt 300 ]; do sleep 0.1; i=\$((i + 1)); done
echo "[aggregators] \$(ls /tmp/*.ready | wc -l) serving"
nc -l -p 7999 > /dev/null
EOF
TMPDIR=$work ip netns exec "$PREFIX-a1" bash "$RXEVM" --nic "vmtap,$AIP/24,$NET.2.1" --copy "$BUILD/server/dlcpd" --timeout 1500 \
  -f "$work/aggregators.sh" --out "$work/agg-out" > "$work/aggregators.log" 2>&1 &
for _ in $(seq 1 240); do grep -q '\[aggregators\] 6 serving' "$work/aggregators.log" && break; sleep 0.5; done
grep -q '\[aggregators\] 6 serving' "$work/aggregators.log" || { echo "rdma_multipath: the aggregator VM did not come up:" >&2; tail -20 "$work/aggregators.log" >&2; exit 1; }

# Worker VM: every run, marked on its console so that the host can read the counters around it.
{
  echo "B=$BUILD"
  cat <<EOF
ping -c 3 -W 2 $AIP > /dev/null || true
run() {  # name ports flags...
  n=\$1 ports=\$2; shift 2
  echo "[run] begin \$n"; sleep 3
  for try in 1 2; do
    \$B/bench/dlcp_bench/dlcp-bench --rpc-timeout-ms=20000 --aggregators=$AIP:\${ports%,*},$AIP:\${ports#*,} --plaintext --transport=rdma --workers=2 \\
      --loss-bound=0 --tensor-bytes=$TENSOR --rounds=$ROUNDS --warmup=1 --timeout-s=300 --json ${BENCH_FLAGS:-} "\$@" > /rxevm/out/\$n.json 2>&1 || true
    grep -q '"exact":true' /rxevm/out/\$n.json && break
  done
  echo "[run] end \$n"; sleep 1
}
EOF
  for s in $SCENARIOS; do
    for t in $(seq 1 "$TRIALS"); do
      echo "run $s.sprayed.$t 7101,7102"
      [[ $s == half ]] && echo "run $s.unsteered.$t 7103,7104 --path-steering=false"
      echo "run $s.unsprayed.$t 7105,7106 --spray-ports=1"
    done
  done
} > "$work/workers.sh"

snapshot() {  # FILE: each spine's bytes and drops, both directions, and the aggregators' result counters
  { "$MP" bytes; "$MP" drops | sed 's/^/drops /'
    for p in 8101 8102 8103 8104 8105 8106; do ip netns exec "$PREFIX-la" curl -s -m 5 "http://$AIP:$p/metrics" || true; done |
      awk '/^dlcp_tx_packets_total\{.*type="result"\}/{sent += $2} /^dlcp_repairs_total\{kind="result_resent"\}/{again += $2}
           /^dlcp_results_not_resent_total /{held += $2} END{printf "results aggregators sent=%d again=%d held=%d\n", sent, again, held}'
  } > "$1"
}
scenario=
: > "$work/workers.log"  # before tail follows it: the VM's shell may open it later
TMPDIR=$work ip netns exec "$PREFIX-w1" bash "$RXEVM" --nic "vmtap,$WIP/24,$NET.1.1" --copy "$BUILD/bench/dlcp_bench/dlcp-bench" --timeout 1200 \
  -f "$work/workers.sh" --out "$work/out" > "$work/workers.log" 2>&1 &
vm=$!
while IFS= read -r line; do
  case $line in
    "[run] begin "*)
      name=${line#'[run] begin '}
      if [[ ${name%%.*} != "$scenario" ]]; then
        scenario=${name%%.*}
        "$MP" rate 1 "$RATE"
        "$MP" rate 2 "$([[ $scenario == half ]] && echo "$HALF" || echo "$RATE")"
      fi
      snapshot "$work/$name.before" ;;
    "[run] end "*) name=${line#'[run] end '}; snapshot "$work/$name.after"; echo "rdma_multipath: $name done" >&2 ;;
  esac
done < <(tail -n +1 -f --pid="$vm" "$work/workers.log")
wait "$vm" || { echo "rdma_multipath: the worker VM failed:" >&2; tail -20 "$work/workers.log" >&2; exit 1; }

python3 - "$work" "$RATE" "$HALF" <<'PY'
import glob, json, os, statistics, sys
work, rate, half = sys.argv[1:4]

def counters(path):
    out = {}
    for line in open(path):
        kind = line.split()[0] if line.startswith(("drops ", "results ")) else "bytes"
        f = line.split()[1:] if kind != "bytes" else line.split()
        out[(kind, f[0])] = [int(v.split("=")[1]) for v in f[1:]]
    return out

runs = []
for path in sorted(glob.glob(f"{work}/out/*.json")):
    name = os.path.basename(path)[:-5]
    scenario, setting, trial = name.split(".")
    text = open(path).read().splitlines()
    lines = [l for l in text if l.startswith("{")]
    r = json.loads(lines[-1]) if lines else {}
    if not r.get("exact"):
        print(f"rdma_multipath: {name} failed:", *[l for l in text if not l.startswith("{")][:4], sep="\n  ", file=sys.stderr)
    try:
        a, b = counters(f"{work}/{name}.after"), counters(f"{work}/{name}.before")
    except FileNotFoundError:
        a = b = {}
    d = {k: [x - y for x, y in zip(a[k], b[k])] for k in a}
    to_aggs = [d.get(("bytes", s), [0, 0])[0] for s in ("s1", "s2")]
    to_workers = [d.get(("bytes", s), [0, 0])[1] for s in ("s1", "s2")]
    share = lambda v: max(v) / sum(v) if sum(v) else float("nan")
    sent, again, held = d.get(("results", "aggregators"), [0, 0, 0])
    row = {"scenario": scenario, "setting": setting, "trial": int(trial), "p50_ms": r.get("p50_ms"),
           "p99_ms": r.get("p99_ms"), "exact": r.get("exact", False), "retransmits": r.get("retransmits"),
           "window_cuts": r.get("window_cuts"), "spine_bytes_to_aggregators": to_aggs,
           "spine_bytes_to_workers": to_workers, "busiest_spine_share": [share(to_aggs), share(to_workers)],
           "spine_drops": [sum(d.get(("drops", s), [0, 0])) for s in ("s1", "s2")],
           "results_sent": sent, "results_sent_again": again, "result_requests_held": held}
    runs.append(row)
    print(json.dumps(row))

med = lambda xs: statistics.median(xs) if xs else float("nan")
print(f"\nRDMA (Soft-RoCE) over two spines, spine rate {rate} (half: spine 2 at {half}), medians over trials")
print("| scenario | setting | p50 ms | p99 ms | p99 / unsprayed p99 | busiest spine's share, pushes / results | chunks pushed again | results sent again / sent | exact |")
print("|---|---|---|---|---|---|---|---|---|")
for scenario in ("equal", "half"):
    rows = {s: [r for r in runs if r["scenario"] == scenario and r["setting"] == s] for s in ("sprayed", "unsteered", "unsprayed")}
    off = med([r["p99_ms"] for r in rows["unsprayed"] if r["p99_ms"]])
    for setting, rs in rows.items():
        if not rs:
            continue
        p99 = med([r["p99_ms"] for r in rs if r["p99_ms"]])
        shares = [med([r["busiest_spine_share"][i] for r in rs]) for i in (0, 1)]
        print(f"| {scenario} | {setting} | {med([r['p50_ms'] for r in rs if r['p50_ms']]):.0f} | {p99:.0f} | "
              f"{p99 / off:.2f} | {shares[0]:.2f} / {shares[1]:.2f} | {med([r['retransmits'] or 0 for r in rs]):.0f} | "
              f"{med([r['results_sent_again'] / max(1, r['results_sent']) for r in rs]):.2f} | {all(r['exact'] for r in rs)} |")
sys.exit(0 if runs and all(r["exact"] for r in runs) else 1)
PY
