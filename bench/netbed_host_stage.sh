#!/usr/bin/env bash
# Host stages on the emulated cluster (scripts/netbed/cluster.sh, 1 Gbit/s ports, strict-priority
# switch), in one run: 2 hosts (w1, w2) of 4 workers each, 20 MiB per round, dlcp with a dlcpd on
# each host (its host stage's broker and one of the job's two aggregators) and its defaults,
# against Gloo's ring all-reduce over TCP across the same 8 ranks. Beside them, dlcp with
# host_stage=false. Reports each round's time (the slowest worker's p50 and p99) and the bytes
# each host's port carries per round each way, from the interface counters, in tensors. Prints one
# JSON line per system, then a ratio table. Needs root.
#   [TENSORS=N] bench/netbed_host_stage.sh [BUILD_DIR]
# TENSORS=N: dlcp all-reduces the round's bytes as N tensors at once (fusion groups, as DeAR
# submits them), Gloo as one.
# CROSS=RATE (say 300M): the congested bed. Best-effort UDP cross traffic at RATE into every
# worker port during each system's run, and dlcp_host_stage_bounded (ε = LOSS_BOUND, 0.05) beside
# the reliable stages, per-worker dlcp and Gloo.
set -Eeuo pipefail
BUILD=$(cd "${1:-build}" && pwd)
HERE=$(cd "$(dirname "$0")" && pwd)
CLUSTER="$HERE/../scripts/netbed/cluster.sh"
export PREFIX=${PREFIX:-dlcpbh}
source "$HERE/../scripts/netbed/session.sh"
netbed_skip_unless_able netbed_host_stage ip tc
netbed_start dlcp-bench-host-stage
TENSOR=${TENSOR:-$((20 << 20))}
ROUNDS=${ROUNDS:-20}
TENSORS=${TENSORS:-1}
CROSS=${CROSS:-}
LOSS_BOUND=${LOSS_BOUND:-0.05}
PER_HOST=4
HOSTS="w1:$(netbed_ip_of 1) w2:$(netbed_ip_of 2)"
counters() { netbed_port_bytes w1 w2; }

# measure NAME COMMAND...: runs it; prints its JSON line with the bytes per round of each port.
measure() {
  local name=$1 before after
  shift
  [ -z "$CROSS" ] || netbed_cross_start 600
  before=$(counters)
  "$@"
  after=$(counters)
  [ -z "$CROSS" ] || netbed_cross_stop
  python3 - "$name" "$before" "$after" "$TENSOR" "$ROUNDS" "$work/$name.json" <<'PY'
import json, sys
name, before, after, tensor, rounds, path = sys.argv[1:]
d = [int(a) - int(b) for a, b in zip(after.split(), before.split())]
row = json.load(open(path))
row.update(system=name, port_tensors_per_round=[round(x / (int(rounds) + 1) / int(tensor), 3) for x in d])
print(json.dumps(row))
PY
}

dlcp() {  # NAME [flags...]: the 8 ranks; the slowest rank's row into $work/NAME.json
  local name=$1 p
  shift
  netbed_host_workers "$BUILD" "$work/$name" $PER_HOST "$HOSTS" --job="$name" --tensors="$TENSORS" \
    --tensor-bytes=$((TENSOR / TENSORS)) --rounds="$ROUNDS" --warmup=1 --timeout-s=300 "$@"
  for p in "${worker_pids[@]}"; do wait "$p"; done
  python3 - "$work/$name" <<'PY' > "$work/$name.json"
import glob, json, sys
rows = [json.loads(open(f).read().strip().splitlines()[-1]) for f in glob.glob(sys.argv[1] + ".[0-9]*")]
worst = max(rows, key=lambda r: r["p50_ms"])
worst["p99_ms"] = max(r["p99_ms"] for r in rows)
worst["exact"] = all(r["exact"] for r in rows)
worst["bound_violations"] = sum(r.get("bound_violations", 0) for r in rows)
worst["max_round_loss"] = max(r.get("max_round_loss", 0) for r in rows)
worst["staged_workers"] = sum(1 for r in rows if r.get("host_stage_size", 0) > 0)
print(json.dumps(worst))
PY
}

gloo() {
  local store="$work/gloo-store" pids=() h r=0 j
  mkdir -p "$store"
  for h in 1 2; do
    for ((j = 0; j < PER_HOST; j++)); do
      ip netns exec "$PREFIX-w$h" "$BUILD/bench/gloo_allreduce" --workers $((2 * PER_HOST)) --rank $r --store "$store" \
        --host "$(netbed_ip_of $h)" --tensor-bytes "$TENSOR" --rounds "$ROUNDS" --warmup 1 >"$work/gloo.$r" 2>&1 &
      pids+=($!)
      r=$((r + 1))
    done
  done
  for p in "${pids[@]}"; do wait "$p"; done
  "$BUILD/bench/gloo_allreduce" --summarize --store "$store" --workers $((2 * PER_HOST)) --tensor-bytes "$TENSOR" \
    --rounds "$ROUNDS" > "$work/gloo_ring_tcp.json"
}

netbed_aggregators "$BUILD" "$HOSTS" || exit 1
{
  measure gloo_ring_tcp gloo
  measure dlcp_host_stage dlcp dlcp_host_stage
  measure dlcp_per_worker dlcp dlcp_per_worker --host-stage=false
  [ -z "$CROSS" ] || measure dlcp_host_stage_bounded dlcp dlcp_host_stage_bounded --loss-bound="$LOSS_BOUND"
} | tee "$work/rows.jsonl"

python3 - "$work/rows.jsonl" "$TENSOR" "$TENSORS" "$CROSS" <<'PY'
import json, sys
rows = {r["system"]: r for r in map(json.loads, open(sys.argv[1]))}
g = rows["gloo_ring_tcp"]
print()
split = f" (dlcp: {sys.argv[3]} tensors at once)" if sys.argv[3] != "1" else ""
cross = f", best-effort cross traffic at {sys.argv[4]} into each worker port" if sys.argv[4] else ""
print(f"2 hosts x 4 workers, {int(sys.argv[2]) >> 20} MiB per round{split}, 1 Gbit/s ports{cross}")
print("| system | p50 ms | p99 ms | p50 / gloo p50 | p99 / gloo p99 | port bytes per round, in tensors (w1 out, w1 in, w2 out, w2 in) "
      "| worst round's loss (violations) | workers staged | exact |")
print("|---|---|---|---|---|---|---|---|---|")
for name in ("dlcp_host_stage_bounded", "dlcp_host_stage", "dlcp_per_worker", "gloo_ring_tcp"):
    if name not in rows:
        continue
    r = rows[name]
    loss = f"{r['max_round_loss']:.4f} ({r['bound_violations']})" if "max_round_loss" in r else "-"
    print(f"| {name} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['p50_ms'] / g['p50_ms']:.2f} | {r['p99_ms'] / g['p99_ms']:.2f} "
          f"| {' / '.join(map(str, r['port_tensors_per_round']))} | {loss} | {r.get('staged_workers', '-')} "
          f"| {'yes' if r.get('exact', True) else 'NO'} |")
PY
