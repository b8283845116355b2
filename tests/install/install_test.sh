#!/usr/bin/env bash
# What `cmake --install` (make install) puts under a prefix works on its own, as a user's build
# and a trainer would use it:
#  - the installed dlcpd, dlcpctl and dlcp-bench name the project's release (--version);
#  - the installed dlcpd serves, and dlcpctl status reports its release;
#  - a C program compiled with `pkg-config dlcp` (tests/integration/c_api_smoke.c) and a C++ one
#    built by CMake with find_package(dlcp) (tests/install/consumer) load the installed
#    libdlcp.so and sum exactly through that dlcpd;
#  - the installed systemd unit starts the installed dlcpd, passes `systemd-analyze verify`, and
#    its example settings are all taken by dlcpd;
#  - the installed Python package imports, names the release and sums through it too.
# Every program it runs has its own deadline (timeout), besides ctest's.
# Usage: tests/install/install_test.sh BUILD_DIR [PYTHON]
set -euo pipefail
BUILD=$(cd "$1" && pwd)
PYTHON=${2:-/usr/bin/python3}
SRC=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d /tmp/dlcp-install.XXXXXX)
PREFIX=$WORK/prefix
DLCPD_PID=
cleanup() {
  [ -n "$DLCPD_PID" ] && kill "$DLCPD_PID" 2>/dev/null && wait "$DLCPD_PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "install_test: $*" >&2; exit 1; }

release=$(sed -nE 's/^project\(dlcp VERSION ([0-9.]+).*/\1/p' "$SRC/CMakeLists.txt")
[ -n "$release" ] || fail "cannot read the release from CMakeLists.txt"
cmake --install "$BUILD" --prefix "$PREFIX" >"$WORK/install.log" || { cat "$WORK/install.log"; fail "cmake --install failed"; }

for b in dlcpd dlcpctl dlcp-bench; do
  [ "$b" = dlcp-bench ] && [ ! -e "$PREFIX/bin/$b" ] && continue  # a build without bench/
  out=$("$PREFIX/bin/$b" --version) || fail "$b --version exited $?"
  [[ $out == "$b $release ("* ]] || fail "$b --version says '$out', not '$b $release (...)'"
done
echo "install_test: binaries name release $release"

"$PREFIX/bin/dlcpd" --host=127.0.0.1 --port=0 --data-port=0 --plaintext --log-level=warning \
  --ready-file="$WORK/ready" 2>"$WORK/dlcpd.log" &
DLCPD_PID=$!
for _ in $(seq 1 200); do [ -s "$WORK/ready" ] && break; sleep 0.05; done
[ -s "$WORK/ready" ] || { cat "$WORK/dlcpd.log"; fail "the installed dlcpd did not become ready in 10 s"; }
AGG="127.0.0.1:$(sed -E 's/.*"control_port":([0-9]+).*/\1/' "$WORK/ready")"
status=$(timeout 30 "$PREFIX/bin/dlcpctl" status --aggregators="$AGG" --plaintext --timeout-ms=5000) || fail "dlcpctl status: $status"
grep -q " $release " <<<"$status" || fail "dlcpctl status does not report release $release: $status"

# Every check below must use what was installed, not the build tree.
uses_installed_lib() {
  local libs
  libs=$(ldd "$1")  # whole, not piped: grep -q would leave ldd writing to a closed pipe
  grep -q "libdlcp.so.0 => $PREFIX/lib[^ ]*/libdlcp.so.0" <<<"$libs" || fail "$1 does not load $PREFIX's libdlcp.so: $libs"
}

# C, through pkg-config.
export PKG_CONFIG_PATH=$(dirname "$(find "$PREFIX" -name dlcp.pc)")
[ "$(pkg-config --modversion dlcp)" = "$release" ] || fail "dlcp.pc says version $(pkg-config --modversion dlcp)"
libdir=$(pkg-config --variable=libdir dlcp)
# shellcheck disable=SC2046  # pkg-config's flags are meant to split
cc -std=c11 -Wall -Wextra -Werror $(pkg-config --cflags dlcp) "$SRC/tests/integration/c_api_smoke.c" \
  -o "$WORK/c_api_smoke" $(pkg-config --libs dlcp) -lpthread -Wl,-rpath,"$libdir" || fail "C build against dlcp.pc failed"
uses_installed_lib "$WORK/c_api_smoke"
timeout 120 "$WORK/c_api_smoke" "$AGG" >"$WORK/c.out" 2>&1 || { cat "$WORK/c.out"; fail "the C program failed"; }
grep -q "c api: ok" "$WORK/c.out" || { cat "$WORK/c.out"; fail "the C program did not report success"; }
echo "install_test: C via pkg-config: ok"

# C++, through find_package(dlcp) in a project of its own.
cmake -S "$SRC/tests/install/consumer" -B "$WORK/consumer" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$PREFIX" >"$WORK/consumer.log" 2>&1 || { cat "$WORK/consumer.log"; fail "find_package(dlcp) failed"; }
cmake --build "$WORK/consumer" >>"$WORK/consumer.log" 2>&1 || { cat "$WORK/consumer.log"; fail "C++ build against dlcp::dlcp failed"; }
uses_installed_lib "$WORK/consumer/sum"
out=$(timeout 120 "$WORK/consumer/sum" "$AGG" 2>"$WORK/sum.err") || fail "the C++ program failed: $out $(cat "$WORK/sum.err")"
[ "$out" = "sum: ok (libdlcp $release)" ] || fail "the C++ program said: $out $(cat "$WORK/sum.err")"
echo "install_test: C++ via find_package: ok"

# The systemd unit: it starts the installed dlcpd, systemd reads it without a complaint, and the
# example settings it points at are ones dlcpd accepts, every one of them taken.
unit=$PREFIX/lib/systemd/system/dlcpd.service
env_example=$(sed -nE 's/.*example is ([^ )]+)\).*/\1/p' "$unit")
grep -qx "ExecStart=$PREFIX/bin/dlcpd" "$unit" || fail "$unit does not start $PREFIX/bin/dlcpd"
[ -f "$env_example" ] || fail "$unit names example settings $env_example, which were not installed"
[ -f "$PREFIX/lib/sysusers.d/dlcp.conf" ] && [ -f "$PREFIX/lib/sysctl.d/90-dlcp.conf" ] || fail "sysusers.d or sysctl.d file missing"
mapfile -t settings < <(grep -E '^DLCP_[A-Z0-9_]+=' "$env_example")
dump=$(env -i "${settings[@]}" "$PREFIX/bin/dlcpd" --dump-config) || fail "dlcpd refuses $env_example: $dump"
for kv in "${settings[@]}"; do
  name=${kv%%=*}
  grep -q "  # env $name\$" <<<"$dump" || fail "$env_example sets $name, which dlcpd does not take: $dump"
done
if command -v systemd-analyze >/dev/null; then
  complaints=$(systemd-analyze verify "$unit" 2>&1) || fail "systemd-analyze verify: $complaints"
  [ -z "$complaints" ] || fail "systemd-analyze verify $unit: $complaints"
  echo "install_test: systemd unit: ok"
else
  echo "install_test: systemd unit: files checked; systemd-analyze is not installed to verify it"
fi

# Python, where the Python binding is built.
if [ -e "$BUILD/python/dlcp/__init__.py" ]; then
  pkg=$(dirname "$(find "$PREFIX" -path '*/dlcp/__init__.py')")
  PYTHONPATH=$(dirname "$pkg") timeout 120 "$PYTHON" - "$AGG" "$release" "$PREFIX" <<'EOF' || fail "the installed Python package failed"
import sys
import numpy as np
import dlcp
agg, release, prefix = sys.argv[1:]
assert dlcp.__file__.startswith(prefix), dlcp.__file__
assert dlcp.__version__ == release, dlcp.__version__
client = dlcp.Client(aggregators=agg, job="installed-python", world_size=1, rank=0, plaintext=True)
x = np.arange(10000, dtype=np.float32)
client.allreduce(3, x)
assert (x == np.arange(10000, dtype=np.float32)).all()
client.close()
EOF
  echo "install_test: Python package: ok"
fi
echo "install_test: ok"
