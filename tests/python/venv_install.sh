#!/usr/bin/env bash
# Installs the dlcp package into fresh venvs the way a user does, with no package index, for the
# Python suites, which then import it from the venv and not from the build tree:
#  1. python3 -m venv --system-site-packages; pip install --no-build-isolation . (the package's
#     own CMake build, in BUILD_DIR/pip-build: from scratch the first time, about 90 s on 2 cores);
#  2. pip wheel . from that build, installed into a second venv: the wheel installs elsewhere.
# Each venv is then checked from outside the tree: the package, its stubs, its C library and header.
#
# Usage: tests/python/venv_install.sh BUILD_DIR PYTHON
set -euo pipefail
BUILD=$(cd "$1" && pwd)
PYTHON=$2
SRC=$(cd "$(dirname "$0")/../.." && pwd)
fail() { echo "venv_install: $*" >&2; exit 1; }
# One compile job: ctest runs this beside the other tests.
PIP_FLAGS=(--no-build-isolation --no-deps --no-index --config-settings "build-dir=$BUILD/pip-build"
           --config-settings jobs=1)

check() {  # VENV: dlcp imports from VENV, from outside the tree, with everything it ships
  (cd / && "$1/bin/python" - "$1" <<'PY') || fail "the package in $1 is not whole"
import pathlib, sys
import dlcp, dlcp.torch
home = pathlib.Path(dlcp.__file__).parent
assert str(home).startswith(sys.argv[1]), f"dlcp imported from {home}, not the venv"
for name in ("py.typed", "__init__.pyi", "torch.pyi", "lib/libdlcp.so.0", "include/dlcp.h"):
    assert (home / name).exists(), f"the installed package has no {name}"
print(f"dlcp {dlcp.__version__} installed in {home}")
PY
}

rm -rf "$BUILD/python-venv" "$BUILD/python-venv-wheel" "$BUILD/wheel"
"$PYTHON" -m venv --system-site-packages "$BUILD/python-venv" ||
  fail "python3 -m venv failed (Debian: apt-get install python3-venv)"
"$BUILD/python-venv/bin/pip" install "${PIP_FLAGS[@]}" "$SRC" || fail "pip install . failed"
check "$BUILD/python-venv"

"$BUILD/python-venv/bin/pip" wheel "${PIP_FLAGS[@]}" -w "$BUILD/wheel" "$SRC" || fail "pip wheel . failed"
"$PYTHON" -m venv --system-site-packages "$BUILD/python-venv-wheel"
"$BUILD/python-venv-wheel/bin/pip" install --no-index --no-deps "$BUILD"/wheel/dlcp-*.whl || fail "pip install of the wheel failed"
check "$BUILD/python-venv-wheel"
