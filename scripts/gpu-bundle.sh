#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh runs into a folder that can travel to a bare GPU machine: the
# CUDA tests and pack_bench, built here (sm_90 + PTX, CUDA runtime linked statically); dlcpd; a
# wheel of the Python package for the GPU machine's Python (3.12 by default: its image's), built
# here with the CUDA packer by that Python's pip; and the shared libraries all of these need
# beyond the C and C++ runtimes (gRPC, protobuf, Abseil, ...), which that machine does not have.
#
#   scripts/gpu-bundle.sh [BUILD_DIR] [OUT_DIR]     (defaults: build, .gpu-bundle)
#   BUNDLE_PYTHON=/path/to/python3.12               the interpreter to build the wheel for
#                                                   (default: pyenv's newest 3.12)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
OUT=${2:-.gpu-bundle}
if ! grep -q '^DLCP_WITH_CUDA:BOOL=ON' "$BUILD/CMakeCache.txt" 2>/dev/null; then
  echo "gpu-bundle: $BUILD is not configured with DLCP_WITH_CUDA=ON (is nvcc on PATH?)" >&2
  exit 1
fi
BUNDLE_PYTHON=${BUNDLE_PYTHON:-$(ls -d "$HOME"/.pyenv/versions/3.12*/bin/python3 2>/dev/null | sort -V | tail -1)}
[ -x "$BUNDLE_PYTHON" ] || { echo "gpu-bundle: no Python 3.12 to build the wheel for (set BUNDLE_PYTHON)" >&2; exit 1; }
cmake --build "$BUILD" --target dlcp_cuda_tests pack_bench dlcpd
rm -rf "$OUT"
mkdir -p "$OUT/lib" "$OUT/wheel"
cp "$BUILD/tests/dlcp_cuda_tests" "$BUILD/bench/pack_bench" "$BUILD/server/dlcpd" "$OUT/"
"$BUNDLE_PYTHON" -m pip wheel --no-build-isolation --no-deps --no-index -w "$OUT/wheel" \
  --config-settings "build-dir=$BUILD-bundle-py$("$BUNDLE_PYTHON" -c 'import sys; print("%d%d" % sys.version_info[:2])')" \
  --config-settings "cmake-args=-DDLCP_WITH_CUDA=ON" .
(cd "$OUT/wheel" && python3 -m zipfile -e dlcp-*.whl unpacked)
# Everything but the loader, libc, libm, libstdc++ and libgcc, which every machine has.
for bin in "$OUT/dlcp_cuda_tests" "$OUT/pack_bench" "$OUT/dlcpd" "$OUT"/wheel/unpacked/dlcp/_dlcp*.so \
           "$OUT/wheel/unpacked/dlcp/lib/libdlcp.so.0"; do
  ldd "$bin" | awk '/=> \// {print $3}' |
    grep -Ev '/(ld-linux|libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt)[.-]' |
    xargs -r cp -L -t "$OUT/lib/"
done
rm -rf "$OUT/wheel/unpacked"
echo "gpu-bundle: $(du -sh "$OUT" | cut -f1) in $OUT; run there: bash scripts/gpu-check.sh --bundle $OUT"
