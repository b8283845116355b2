#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each for a bounded time over its
# seed corpus in tests/fuzz/corpus/:
#   wire_fuzz     the data-plane packet parser, range lists and MAC check
#   control_fuzz  the control-plane request handlers (Join, Leave, Heartbeat, GetTopology, GetStats,
#                 Regroup)
#   host_fuzz     the messages of dlcpd's host socket (a worker's hello, dlcpd's welcome)
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [OUT_DIR] [BUILD_DIR]
# BUILD_DIR is a configured and built tree (for the generated protobuf code). Exits non-zero on any
# crash or sanitizer report; prints the inputs each target ran.
set -euo pipefail
SECONDS_PER_TARGET=${1:-30}
OUT=${2:-build/fuzz}
BUILD=${3:-build}
cd "$(dirname "$0")/.."
command -v clang++ >/dev/null || { echo "fuzz: clang++ not installed (scripts/install-deps.sh installs it)"; exit 1; }
[ -f "$BUILD/proto/gen/dlcp/v1/control.pb.cc" ] || { echo "fuzz: build $BUILD first (generated protobuf code)"; exit 1; }
mkdir -p "$OUT"
FLAGS=(-std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I. -I"$BUILD/generated"
       -I"$BUILD/proto/gen")
LIBS=$(pkg-config --libs grpc++ protobuf absl_status absl_statusor absl_strings absl_str_format absl_time \
       absl_synchronization libcrypto re2)
WIRE=(common/wire/header.cc common/wire/ranges.cc common/wire/mac.cc common/wire/bounded.cc common/wire/payload_encoding.cc
      common/wire/version_check.cc)
# The RDMA transport when the build has it (build_config.h); libibverbs itself is dlopen()ed.
RDMA=()
if grep -q 'DLCP_WITH_RDMA 1' "$BUILD/generated/common/base/build_config.h"; then
  RDMA=(common/transport/rdma/grh.cc common/transport/rdma/verbs_loader.cc common/transport/rdma/rdma_device.cc
        common/transport/rdma/rdma_transport.cc)
fi

# control_fuzz's sources are one translation unit, as the sanitizer builds' unity batches are
# (Makefile): each would otherwise parse the same gRPC, protobuf and Abseil headers again, which
# was most of this test's time. protoc's two files stay apart: they define the same file-static
# tables.
CONTROL=(tests/fuzz/control_fuzz.cc "${WIRE[@]}"
  common/base/log.cc common/base/check.cc common/base/syscall.cc common/base/host_port.cc common/metrics/registry.cc
  common/topology/topology.cc common/transport/address.cc common/transport/factory.cc common/transport/waker.cc
  common/transport/udp/udp_transport.cc common/transport/loopback/loopback_transport.cc
  common/transport/rdma/port_counters.cc "${RDMA[@]}"
  common/datapath/outbox.cc common/datapath/path_shares.cc common/reduce/sum.cc server/rounds/round.cc
  server/rounds/block_pool.cc server/jobs/job_registry.cc server/jobs/key_ring.cc server/jobs/regroup_barrier.cc
  server/jobs/roster.cc common/metrics/straggler_board.cc
  server/data/data_plane.cc server/data/data_thread.cc server/data/data_metrics.cc server/data/bounded_rounds.cc
  server/rounds/loss_tracker.cc
  common/faults/drop_injector.cc server/control/aggregator_service.cc server/control/drain_tracker.cc
  server/control/client_gate.cc common/security/client_certificates.cc common/rpc/grpc_peer.cc)
printf '#include "%s"\n' "${CONTROL[@]}" > "$OUT/control_unity.cc"

clang++ "${FLAGS[@]}" tests/fuzz/wire_fuzz.cc "${WIRE[@]}" "${RDMA[@]:0:1}" $LIBS -lhighwayhash -o "$OUT/wire_fuzz" &
wire=$!
clang++ "${FLAGS[@]}" tests/fuzz/host_fuzz.cc common/shm/host_hello.cc $LIBS -o "$OUT/host_fuzz" &
host=$!
clang++ "${FLAGS[@]}" -c "$OUT/control_unity.cc" -o "$OUT/control_unity.o" &
unity=$!
clang++ "${FLAGS[@]}" -c "$BUILD/proto/gen/dlcp/v1/control.pb.cc" -o "$OUT/control.pb.o" &
pb=$!
clang++ "${FLAGS[@]}" -c "$BUILD/proto/gen/dlcp/v1/control.grpc.pb.cc" -o "$OUT/control.grpc.pb.o" &
grpcpb=$!
wait $wire || { echo "fuzz: building wire_fuzz failed"; exit 1; }
wait $host || { echo "fuzz: building host_fuzz failed"; exit 1; }
wait $unity && wait $pb && wait $grpcpb || { echo "fuzz: compiling control_fuzz failed"; exit 1; }
clang++ "${FLAGS[@]}" "$OUT/control_unity.o" "$OUT/control.pb.o" "$OUT/control.grpc.pb.o" $LIBS -lhighwayhash \
  -lpthread -ldl -o "$OUT/control_fuzz" || { echo "fuzz: linking control_fuzz failed"; exit 1; }

status=0
for target in wire control host; do
  work="$OUT/${target}_corpus"
  mkdir -p "$work"
  "$OUT/${target}_fuzz" -max_total_time="$SECONDS_PER_TARGET" -max_len=4096 -print_final_stats=1 \
    -artifact_prefix="$OUT/${target}-" "$work" "tests/fuzz/corpus/$target" > "$OUT/${target}_fuzz.log" 2>&1 || true
  runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$OUT/${target}_fuzz.log" | grep -oE '[0-9]+$' || echo 0)
  if grep -qE "==[0-9]+==ERROR|deadly signal|runtime error:|BINGO" "$OUT/${target}_fuzz.log" || [ "$runs" -eq 0 ]; then
    echo "fuzz: ${target}_fuzz failed after $runs inputs; see $OUT/${target}_fuzz.log and $OUT/${target}-*"
    grep -E "==ERROR|SUMMARY|runtime error" "$OUT/${target}_fuzz.log" | head -5
    status=1
  else
    echo "fuzz: ${target}_fuzz ran $runs inputs in ${SECONDS_PER_TARGET} s, no failure"
  fi
done
exit $status
