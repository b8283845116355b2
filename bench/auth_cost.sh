#!/usr/bin/env bash
# The end-to-end cost of data-packet authentication: the same jobs against three aggregators, one
# with per-worker keys (the default: each result copy signed with its destination's key, a pass
# over its payload per worker), one with a single key for the job (--per-worker-data-keys=false:
# one digest per result chunk) and one without authentication, interleaved in one run. Prints
# JSON lines and a ratio table (each over the unauthenticated time).  bench/auth_cost.sh [BUILD_DIR]
set -euo pipefail
BUILD=${1:-build}
REPS=${REPS:-3}
source "$(dirname "$0")/loopback_lib.sh"
start_dlcpd per_worker --data-auth
start_dlcpd one_key --data-auth --per-worker-data-keys=false
start_dlcpd off --no-data-auth
for rep in $(seq 1 "$REPS"); do
  for spec in "2 104857600 5" "4 4194304 30"; do
    read -r n size rounds <<<"$spec"
    for mode in per_worker one_key off; do
      run_job $mode "\"auth\":\"$mode\"" --workers="$n" --tensor-bytes="$size" --rounds="$rounds" --warmup=2
    done
  done
done
report auth <<'PY'
header("workers", "size", "p50 ms, auth off", "one job key", "per-worker keys", "one key / off", "per-worker / off",
       "per-worker / one key")
for (n, b), g in sorted(groups.items()):
    off, one, per = (med(g[m], "p50_ms") for m in ("off", "one_key", "per_worker"))
    row(n, size(b), f"{off:.1f}", f"{one:.1f}", f"{per:.1f}", f"{one / off:.2f}", f"{per / off:.2f}", f"{per / one:.2f}")
PY
