#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each for a bounded time over
# its seed corpus in tests/fuzz/corpus/. Usage: scripts/fuzz.sh [SECONDS] [OUT_DIR]
# Exits non-zero on any crash or sanitizer report; prints executions run.
set -euo pipefail
SECONDS_PER_TARGET=${1:-30}
OUT=${2:-build/fuzz}
cd "$(dirname "$0")/.."
command -v clang++ >/dev/null || { echo "fuzz: clang++ not installed (scripts/install-deps.sh installs it)"; exit 1; }
mkdir -p "$OUT"
ABSL_LIBS=$(pkg-config --libs absl_status absl_statusor absl_strings)
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I. \
  tests/fuzz/wire_fuzz.cc common/wire/header.cc common/wire/ranges.cc common/wire/mac.cc $ABSL_LIBS -lhighwayhash \
  -o "$OUT/wire_fuzz"
work="$OUT/wire_corpus"
mkdir -p "$work"
"$OUT/wire_fuzz" -max_total_time="$SECONDS_PER_TARGET" -max_len=2048 -print_final_stats=1 \
  -artifact_prefix="$OUT/" "$work" tests/fuzz/corpus/wire 2>&1 | tee "$OUT/wire_fuzz.log" | grep -E "^#[0-9]+ *DONE|stat::number_of_executed_units|ERROR|BINGO" || true
grep -q "ERROR" "$OUT/wire_fuzz.log" && { echo "fuzz: wire_fuzz found a failure, see $OUT/"; exit 1; }
echo "fuzz: wire_fuzz ran $(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$OUT/wire_fuzz.log" | grep -oE '[0-9]+$') inputs, no failure"
