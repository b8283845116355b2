#!/usr/bin/env bash
# The GPU check. Two parts, each in about 4 minutes on an H200:
#  1. The CUDA packer: the CUDA tests compare the GPU's packets with the CPU packer's byte for
#     byte, then packing 1 GiB of float32 gradients is timed against a device-to-device copy of
#     the same bytes in the same run. Target: at least 0.7 of the copy's bandwidth. Where
#     compute-sanitizer is installed, the tests also run under its memory checker.
#  2. PyTorch on CUDA (scripts/gpu_torch_check.py): the package installed with pip into a venv
#     of the machine's Python and torch; 2 dlcpd on loopback; 4 workers sharing the GPU train a
#     CNN with DistributedOptimizer and with DDP plus the comm hook, against DDP over Gloo on the
#     same CUDA tensors (float32, two backward passes per step, AMP; parameters within 1e-5 after
#     20 steps), and a bfloat16 model; the same job again with its workers in two host stages of
#     two (each dlcpd serving one host's socket), their CUDA gradients copied into the stages'
#     pinned shared memory; step times against DDP over Gloo.
#
#   scripts/gpu-check.sh [BUILD_DIR]       build here (needs the project's dependencies), then run
#   scripts/gpu-check.sh --bundle DIR      run what scripts/gpu-bundle.sh packed elsewhere (a bare
#                                          GPU machine without gRPC or Abseil)
#   PARTS="packer torch" (the default), or one of them.  PYTHON: the interpreter with torch
#   (default python3).  MEMCHECK_S: seconds for the tests under compute-sanitizer (default 200;
#   0 leaves them out).
# Exit status: 0 when every part passed on a device; 1 otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
PARTS=${PARTS:-packer torch}
PYTHON=${PYTHON:-python3}
MEMCHECK_S=${MEMCHECK_S:-200}
VENV=/tmp/dlcp-gpu-check-venv
rm -rf "$VENV"
if [ "${1:-}" = "--bundle" ]; then
  BIN=$(cd "${2:?usage: gpu-check.sh --bundle DIR}" && pwd)  # absolute: the PyTorch part runs from /tmp
  TESTS=$BIN/dlcp_cuda_tests
  BENCH=$BIN/pack_bench
  DLCPD=$BIN/dlcpd
  export LD_LIBRARY_PATH=$BIN/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  install_package() { "$VENV/bin/pip" install --no-index --no-deps "$BIN"/wheel/dlcp-*.whl; }
else
  BUILD=${1:-build-gpu}
  [ -f "$BUILD/CMakeCache.txt" ] ||
    cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDLCP_WITH_CUDA=ON -DPython3_EXECUTABLE=/usr/bin/python3
  timeout 240 cmake --build "$BUILD" --target dlcp_cuda_tests pack_bench dlcpd || exit 1
  TESTS=$BUILD/tests/dlcp_cuda_tests
  BENCH=$BUILD/bench/pack_bench
  DLCPD=$BUILD/server/dlcpd
  install_package() {
    "$VENV/bin/pip" install --no-build-isolation --no-deps --no-index --config-settings "build-dir=$BUILD-python" \
      --config-settings "cmake-args=-DDLCP_WITH_CUDA=ON" .
  }
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
status=0

packer_part() {
  echo "== CUDA packer against the CPU packer"
  out=$(timeout 180 "$TESTS" 2>&1)
  rc=$?
  echo "$out" | grep -E '^\[ +(OK|FAILED|SKIPPED|PASSED) +\]|Failure|differ|UNAVAILABLE' | head -40
  if [ $rc -ne 0 ]; then echo "gpu-check: the CUDA tests failed (exit $rc)"; return 1; fi
  if echo "$out" | grep -q '\[  SKIPPED \]'; then echo "gpu-check: no usable CUDA device; nothing ran on a GPU"; return 1; fi

  # Where the toolkit's memory checker is installed (and the runtime lets it attach), the tests again
  # under it, the slowest left out: an out-of-bounds or misaligned access fails the check.
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  if [ -n "$CS" ] && [ "$MEMCHECK_S" -gt 0 ]; then
    echo "== the CUDA tests under compute-sanitizer (memcheck)"
    timeout "$MEMCHECK_S" "$CS" --tool memcheck --error-exitcode 3 "$TESTS" --gtest_filter='-*OverManySizes' >/tmp/gpu-check-memcheck.log 2>&1
    mc=$?
    grep -E 'ERROR SUMMARY|Device not supported' /tmp/gpu-check-memcheck.log | head -3
    if [ $mc -eq 3 ]; then echo "gpu-check: compute-sanitizer found memory errors"; return 1; fi
    [ $mc -ne 0 ] && echo "gpu-check: the tests under compute-sanitizer exited $mc; memory not fully checked"
  fi

  echo "== packing 1 GiB of float32 gradients vs a device-to-device copy"
  for enc in f32 bf16; do
    json=$(timeout 120 "$BENCH" --device=cuda --mib=1024 --reps=10 --encoding=$enc) || { echo "gpu-check: pack_bench failed"; return 1; }
    echo "$json"
    ratio=$(echo "$json" | head -1 | sed -n 's/.*"device": "cuda"[^}]*"ratio": \([0-9.]*\).*/\1/p')
    # The target is for float32 payloads; bf16 writes half the bytes and is reported alongside.
    if [ "$enc" = f32 ] && ! awk -v r="$ratio" 'BEGIN { exit !(r >= 0.7) }'; then
      echo "gpu-check: float32 packing reached $ratio of copy bandwidth; the target is 0.7"
      status=1
    fi
  done
}

# A venv that sees PYTHON's packages (torch). Where PYTHON is itself a venv's (as on images that
# keep PyTorch in one), --system-site-packages would reach only its base installation's, so a .pth
# file names PYTHON's own site-packages too.
make_venv() {
  "$PYTHON" -m venv --system-site-packages "$VENV" || return 1
  local site
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))') || return 1
  "$PYTHON" -c 'import site, sys; print("\n".join(site.getsitepackages()) if sys.prefix != sys.base_prefix else "")' \
    >"$site/dlcp-gpu-check-parent.pth"
}

torch_part() {
  echo "== PyTorch on CUDA: DistributedOptimizer and the comm hook against DDP over Gloo"
  make_venv && install_package >/tmp/gpu-check-pip.log 2>&1 ||
    { tail -20 /tmp/gpu-check-pip.log; echo "gpu-check: installing the package failed"; return 1; }
  local work pids=() addrs=() i
  work=$(mktemp -d)
  for i in 0 1; do
    "$DLCPD" --host=127.0.0.1 --port=0 --data-port=0 --plaintext --log-level=warning --ready-file="$work/ready$i" \
      --host-socket="$work/host$i.sock" >"$work/dlcpd$i.log" 2>&1 &
    pids+=($!)
  done
  for i in 0 1; do
    for _ in $(seq 100); do [ -s "$work/ready$i" ] && break; sleep 0.1; done
    [ -s "$work/ready$i" ] || { cat "$work/dlcpd$i.log"; kill "${pids[@]}"; echo "gpu-check: dlcpd did not start"; return 1; }
    addrs+=("127.0.0.1:$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["control_port"])' "$work/ready$i")")
  done
  (cd /tmp && timeout 480 "$VENV/bin/python" "$OLDPWD/scripts/gpu_torch_check.py" --aggregators="${addrs[0]},${addrs[1]}" \
    --host-sockets="$work/host0.sock,$work/host1.sock")
  local rc=$?
  kill "${pids[@]}" 2>/dev/null
  wait "${pids[@]}" 2>/dev/null
  [ $rc -eq 0 ] || { echo "gpu-check: the PyTorch check failed (exit $rc)"; return 1; }
}

for part in $PARTS; do
  "${part}_part" || status=1
done
[ $status -eq 0 ] && echo "gpu-check: passed"
exit $status
