#!/usr/bin/env bash
# Installs the Debian 12 packages dlcp needs to build, test and benchmark.
# Idempotent: when every package is present it returns after one dpkg query.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev libabsl-dev
  libre2-dev  # dlcpd --job-owner-pattern (gRPC depends on it too)
  libssl-dev  # certificate and key checks (common/security/tls.cc); gRPC uses the same OpenSSL
  prometheus-cpp-dev libhighwayhash-dev
  libgtest-dev libgmock-dev libbenchmark-dev libgloo-dev
  clang libclang-rt-14-dev openssl
  python3
  # The Python package (client/python) and its tests and demo: PyTorch 1.13 for /usr/bin/python3.
  python3-dev pybind11-dev python3-numpy python3-torch python3-sklearn python3-matplotlib
  python3-pytest python3-pytest-timeout
  python3-venv python3-pip  # pip install . into a fresh venv (tests/python/venv_install.sh)
  iproute2 ethtool iperf3 iputils-ping  # the congested-cluster test bed (tests/netbed)
  libfaketime  # steps of the wall clock under a running job (faults_test)
  libcap2-bin  # setcap: a non-root dlcpd given cap_ipc_lock as its image gives it (binaries_test)
  # The RDMA transport: verbs headers to build it (the library is loaded at run time), and the
  # Soft-RoCE VM that tests it against real verbs (tests/rdma-vm).
  libibverbs-dev ibverbs-providers qemu-system-x86 busybox-static cpio
)

# The manifest tests need Node.js and npm; a machine that ships its own node keeps it.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  PACKAGES+=(nodejs npm)
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
