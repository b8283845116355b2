#!/usr/bin/env bash
# The GPU check of the CUDA packer. Runs the CUDA tests, which
# compare the GPU's packets with the CPU packer's byte for byte, then times packing 1 GiB of
# float32 gradients against a device-to-device copy of the same bytes in the same run. Target:
# packing reaches at least 0.7 of the copy's bandwidth. Where compute-sanitizer is installed, the
# tests also run under its memory checker. Finishes within 5 minutes on an H200.
#
#   scripts/gpu-check.sh [BUILD_DIR]       build here (needs the project's dependencies), then run
#   scripts/gpu-check.sh --bundle DIR      run binaries that scripts/gpu-bundle.sh packed elsewhere
#                                          (a bare GPU machine without gRPC or Abseil)
# Exit status: 0 when the tests pass on a device and the target is met; 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--bundle" ]; then
  BIN=${2:?usage: gpu-check.sh --bundle DIR}
  TESTS=$BIN/dlcp_cuda_tests
  BENCH=$BIN/pack_bench
  export LD_LIBRARY_PATH=$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
  BUILD=${1:-build-gpu}
  [ -f "$BUILD/CMakeCache.txt" ] ||
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDLCP_WITH_CUDA=ON -DPython3_EXECUTABLE=/usr/bin/python3
  timeout 240 cmake --build "$BUILD" --target dlcp_cuda_tests pack_bench || exit 1
  TESTS=$BUILD/tests/dlcp_cuda_tests
  BENCH=$BUILD/bench/pack_bench
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

echo "== CUDA packer against the CPU packer"
out=$(timeout 180 "$TESTS" 2>&1)
rc=$?
echo "$out" | grep -E '^\[ +(OK|FAILED|SKIPPED|PASSED) +\]|Failure|differ|UNAVAILABLE' | head -40
if [ $rc -ne 0 ]; then echo "gpu-check: the CUDA tests failed (exit $rc)"; exit 1; fi
if echo "$out" | grep -q '\[  SKIPPED \]'; then echo "gpu-check: no usable CUDA device; nothing ran on a GPU"; exit 1; fi

# Where the toolkit's memory checker is installed (and the runtime lets it attach), the tests again
# under it, the slowest left out: an out-of-bounds or misaligned access fails the check.
CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ -n "$CS" ]; then
  echo "== the CUDA tests under compute-sanitizer (memcheck)"
  timeout 200 "$CS" --tool memcheck --error-exitcode 3 "$TESTS" --gtest_filter='-*OverManySizes' >/tmp/gpu-check-memcheck.log 2>&1
  mc=$?
  grep -E 'ERROR SUMMARY|Device not supported' /tmp/gpu-check-memcheck.log | head -3
  if [ $mc -eq 3 ]; then echo "gpu-check: compute-sanitizer found memory errors"; exit 1; fi
  [ $mc -ne 0 ] && echo "gpu-check: the tests under compute-sanitizer exited $mc; memory not fully checked"
fi

echo "== packing 1 GiB of float32 gradients vs a device-to-device copy"
status=0
for enc in f32 bf16; do
  json=$(timeout 120 "$BENCH" --device=cuda --mib=1024 --reps=10 --encoding=$enc) || { echo "gpu-check: pack_bench failed"; exit 1; }
  echo "$json"
  ratio=$(echo "$json" | head -1 | sed -n 's/.*"device": "cuda"[^}]*"ratio": \([0-9.]*\).*/\1/p')
  # The target is for float32 payloads; bf16 writes half the bytes and is reported alongside.
  if [ "$enc" = f32 ] && ! awk -v r="$ratio" 'BEGIN { exit !(r >= 0.7) }'; then
    echo "gpu-check: float32 packing reached $ratio of copy bandwidth; the target is 0.7"
    status=1
  fi
done
[ $status -eq 0 ] && echo "gpu-check: passed"
exit $status
