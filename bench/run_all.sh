#!/usr/bin/env bash
# `make bench`: every benchmark, one after another, each printing JSON and a ratio table.
set -euo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/.."
echo "== reduction engine vs STREAM add"
"$BUILD/bench/engine_bench" --benchmark_min_time=0.2
echo
echo "== dlcp vs Gloo ring all-reduce"
bash bench/compare_gloo/compare_gloo.sh "$BUILD"
echo
echo "== cost of data-packet authentication"
bash bench/auth_cost.sh "$BUILD"
