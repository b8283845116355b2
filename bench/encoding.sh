#!/usr/bin/env bash
# float32 against float16 / bfloat16 payloads: the same jobs against one local dlcpd, the
# encodings interleaved in one run. Prints JSON lines and a ratio table (p50 round time and bytes
# pushed, each encoding over float32). On one host the data path is CPU-bound, so the time ratio
# shows what the conversions cost; on a network-bound fabric the halved bytes are the gain.
#   bench/encoding.sh [BUILD_DIR]
set -euo pipefail
BUILD=${1:-build}
REPS=${REPS:-3}
source "$(dirname "$0")/loopback_lib.sh"
start_dlcpd one
for rep in $(seq 1 "$REPS"); do
  for spec in "2 104857600 5" "4 4194304 30"; do
    read -r n size rounds <<<"$spec"
    for enc in f32 f16 bf16; do
      run_job one "\"encoding\":\"$enc\"" --workers="$n" --tensor-bytes="$size" --rounds="$rounds" --warmup=2 \
        --loss-bound=0 --payload-encoding=$enc
    done
  done
done
report encoding <<'PY'
header("workers", "size", "encoding", "p50 ms", "p50 / f32", "exact")
for (n, b), g in sorted(groups.items()):
    base = med(g["f32"], "p50_ms")
    for enc in ("f32", "f16", "bf16"):
        p50 = med(g[enc], "p50_ms")
        row(n, size(b), enc, f"{p50:.1f}", f"{p50 / base:.2f}", all(r["exact"] for r in g[enc]))
PY
