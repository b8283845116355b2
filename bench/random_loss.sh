#!/usr/bin/env bash
# Rounds under random loss (a lossy link, not a full queue) against loss-free rounds: 4 workers
# and 2 local dlcpd, 17 MiB per round, default settings, with 10% of every droppable class's
# pushes dropped at the workers (dlcp-bench --inject-drop-class) at ε = 0, 0.1 and 0.2. Beside
# them, the same lossy jobs with every loss read as congestion (--congestion-delay-us=0), as the
# window did before it looked at round trips. Interleaved in one run, REPS (3) times. Prints JSON
# lines and a table: p50 and p99 round time, the ratio to the loss-free default (ε = 0) and to
# the loss-free round of the same ε, the tail wait (bound met to STOP), repairs and window cuts.
#   bench/random_loss.sh [BUILD_DIR]
set -euo pipefail
BUILD=${1:-build}
REPS=${REPS:-3}
source "$(dirname "$0")/loopback_lib.sh"
start_dlcpd a1
start_dlcpd a2
DROPS=--inject-drop-class=1:0.1,2:0.1,3:0.1
for rep in $(seq 1 "$REPS"); do
  for spec in "free 0" "free 0.2" "lossy 0" "lossy 0.1" "lossy 0.2" "lossy-every-loss-cuts 0" "lossy-every-loss-cuts 0.2"; do
    read -r kind eps <<<"$spec"
    flags=()
    [[ $kind == lossy* ]] && flags+=("$DROPS")
    [[ $kind == lossy-every-loss-cuts ]] && flags+=(--congestion-delay-us=0)
    run_job a1,a2 "\"setting\":\"$kind eps=$eps\",\"kind\":\"$kind\",\"eps\":$eps" --workers=4 \
      --tensor-bytes=17825792 --rounds=10 --loss-bound="$eps" --job="random-loss-$rep-$kind-$eps" "${flags[@]}"
  done
done
report setting <<'PY'
header("setting", "p50 ms", "p99 ms", "p50 / loss-free ε=0", "p50 / loss-free same ε", "tail wait p50 ms",
       "chunks pushed again", "window cuts", "losses tolerated", "exact")
for (n, b), g in sorted(groups.items()):
    base = med(g["free eps=0"], "p50_ms")
    for name, rows in g.items():
        eps = rows[0]["eps"]
        same = g.get(f"free eps={eps}")
        row(name, f"{med(rows, 'p50_ms'):.1f}", f"{med(rows, 'p99_ms'):.1f}", f"{med(rows, 'p50_ms') / base:.2f}",
            f"{med(rows, 'p50_ms') / med(same, 'p50_ms'):.2f}" if same else "",
            f"{med(rows, 'tail_wait_p50_ms'):.2f}" if eps > 0 else "", int(med(rows, "retransmits")),
            int(med(rows, "window_cuts")), int(med(rows, "losses_tolerated")),
            all(r["exact"] for r in rows))
PY
