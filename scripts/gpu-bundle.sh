#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh runs into a folder that can travel to a bare GPU machine: the
# CUDA tests and pack_bench, built here (sm_90 + PTX, CUDA runtime linked statically), and the
# shared libraries they need beyond the C and C++ runtimes.
#
#   scripts/gpu-bundle.sh [BUILD_DIR] [OUT_DIR]     (defaults: build, .gpu-bundle)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
OUT=${2:-.gpu-bundle}
if ! grep -q '^DLCP_WITH_CUDA:BOOL=ON' "$BUILD/CMakeCache.txt" 2>/dev/null; then
  echo "gpu-bundle: $BUILD is not configured with DLCP_WITH_CUDA=ON (is nvcc on PATH?)" >&2
  exit 1
fi
cmake --build "$BUILD" --target dlcp_cuda_tests pack_bench
rm -rf "$OUT"
mkdir -p "$OUT/lib"
cp "$BUILD/tests/dlcp_cuda_tests" "$BUILD/bench/pack_bench" "$OUT/"
# Everything but the loader, libc, libm, libstdc++ and libgcc, which every machine has.
for bin in "$OUT/dlcp_cuda_tests" "$OUT/pack_bench"; do
  ldd "$bin" | awk '/=> \// {print $3}' |
    grep -Ev '/(ld-linux|libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt)[.-]' |
    xargs -r cp -L -t "$OUT/lib/"
done
echo "gpu-bundle: $(du -sh "$OUT" | cut -f1) in $OUT; run there: bash scripts/gpu-check.sh --bundle $OUT"
