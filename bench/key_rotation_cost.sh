#!/usr/bin/env bash
# What data-key rotation costs a running job (docs/security.md, "Key rotation"): the same jobs
# against two aggregators, one drawing a new key every second (--data-key-rotation-s=1) and one
# keeping its key, interleaved in one run. Both announce a 600 ms heartbeat deadline, so workers
# beat every 200 ms and a rotation takes about 1.5 s. Each job runs JOB_SECONDS (6) of rounds.
# Prints JSON lines and a ratio table (rotating / fixed), with the rotations the rotating
# aggregator settled during the run.  bench/key_rotation_cost.sh [BUILD_DIR]
set -euo pipefail
BUILD=${1:-build}
REPS=${REPS:-3}
JOB_SECONDS=${JOB_SECONDS:-6}
source "$(dirname "$0")/loopback_lib.sh"
start_dlcpd rotating --metrics-port=0 --heartbeat-timeout-ms=600 --data-key-rotation-s=1
start_dlcpd fixed --metrics-port=0 --heartbeat-timeout-ms=600 --data-key-rotation-s=0
settled() {  # python3, not curl: the project's set-up installs the one, not the other
  python3 -c 'import sys, urllib.request
body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=5).read().decode()
print(next(l.split()[-1] for l in body.splitlines() if l.startswith("dlcp_data_key_rotations_total{phase=\"settled\"}")))' \
    "${METRICS[rotating]}"
}
for rep in $(seq 1 "$REPS"); do
  for spec in "4 4194304" "2 104857600"; do
    read -r n size <<<"$spec"
    for mode in rotating fixed; do
      before=$(settled)
      j=$("$BUILD/bench/dlcp_bench/dlcp-bench" --plaintext --aggregators="${AGG[$mode]}" --workers="$n" --tensor-bytes="$size" \
          --rounds=3 --min-seconds="$JOB_SECONDS" --warmup=2 --json | tail -1)
      rotations=$([ $mode = rotating ] && python3 -c "print(int(float('$(settled)') - float('$before')))" || echo 0)
      echo "{\"keys\":\"$mode\",\"rotations_settled\":$rotations,${j#\{}" | tee -a "$BENCH_OUT"
    done
  done
done
report keys <<'PY'
header("workers", "size", "p50 / p99 ms, fixed key", "p50 / p99 ms, rotating", "rotating / fixed p50, p99",
       "rotations per job", "exact")
for (n, b), g in sorted(groups.items()):
    fixed, rotating = g["fixed"], g["rotating"]
    row(n, size(b), f"{med(fixed, 'p50_ms'):.1f} / {med(fixed, 'p99_ms'):.1f}",
        f"{med(rotating, 'p50_ms'):.1f} / {med(rotating, 'p99_ms'):.1f}",
        f"{med(rotating, 'p50_ms') / med(fixed, 'p50_ms'):.2f}, {med(rotating, 'p99_ms') / med(fixed, 'p99_ms'):.2f}",
        f"{med(rotating, 'rotations_settled'):.0f}", all(r["exact"] for m in g.values() for r in m))
PY
