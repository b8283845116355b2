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
echo "== workers of one host through its host stage, against Gloo and against pushing each its own"
bash bench/host_stage.sh "$BUILD"
echo
echo "== float32 against float16 / bfloat16 payloads"
bash bench/encoding.sh "$BUILD"
echo
echo "== packing gradients (CPU; the CUDA packer where a device is usable) against a copy"
"$BUILD/bench/pack_bench" --mib=256
echo
echo "== cost of data-packet authentication"
bash bench/auth_cost.sh "$BUILD"
echo
echo "== the IPv6 data plane against the IPv4 one"
bash bench/ipv6_cost.sh "$BUILD"
echo
echo "== cost of rotating data keys under a running job"
bash bench/key_rotation_cost.sh "$BUILD"
echo
echo "== cost of the per-op timeline (DLCP_TIMELINE)"
bash bench/timeline_cost.sh "$BUILD"
echo
echo "== random loss (a lossy link) against loss-free rounds"
bash bench/random_loss.sh "$BUILD"
echo
echo "== losing an aggregator and getting it back (on_aggregator_loss=remap)"
bash bench/failover.sh "$BUILD"
echo
echo "== under congestion on the emulated cluster (root only)"
if [ "$(id -u)" = 0 ]; then bash bench/netbed_compare.sh "$BUILD"; else echo "skipped: needs root"; fi
echo
echo "== host stages on the emulated cluster: 2 hosts x 4 workers against Gloo (root only)"
if [ "$(id -u)" = 0 ]; then bash bench/netbed_host_stage.sh "$BUILD"; else echo "skipped: needs root"; fi
echo
echo "== time to accuracy under congestion, PyTorch on the emulated cluster (root only)"
if [ "$(id -u)" = 0 ]; then bash bench/netbed_tta.sh "$BUILD"; else echo "skipped: needs root"; fi
echo
echo "== path spraying on the two-spine multipath test bed (root only)"
if [ "$(id -u)" = 0 ]; then bash bench/netbed_spray.sh "$BUILD"; else echo "skipped: needs root"; fi
echo
echo "== path spraying over RDMA (Soft-RoCE in two VMs) on the two-spine test bed (root only)"
if [ "$(id -u)" = 0 ]; then bash bench/rdma_multipath.sh "$BUILD"; else echo "skipped: needs root"; fi
