#!/usr/bin/env bash
# No container engine runs here, so the image is checked by what it is made of:
#  - its build stage runs scripts/install-deps.sh (so build dependencies cannot drift), and
#    installs with `cmake --install`, as `make install` does;
#  - every shared library the shipped binaries load comes from a package in
#    deploy/docker/runtime-packages.txt, or from the base image (libc6, libgcc-s1, libstdc++6);
#  - every listed package exists in Debian 12 and is needed by some binary;
#  - the trainer image's Python packages (trainer-packages.txt) are ones install-deps.sh installs,
#    and it ships the Python package whose extension's libraries runtime-packages.txt covers;
#  - every stage uses the same pinned base image, and the runtime user is not root.
# Usage: tests/docker/lockstep.sh BUILD_DIR
set -euo pipefail
BUILD=$1
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DOCKERFILE="$ROOT/deploy/docker/Dockerfile"
LIST="$ROOT/deploy/docker/runtime-packages.txt"
fail() { echo "lockstep: $*"; exit 1; }

grep -q '^RUN bash scripts/install-deps.sh' "$DOCKERFILE" || fail "build stage does not run scripts/install-deps.sh"
mapfile -t bases < <(grep -E '^FROM ' "$DOCKERFILE" | awk '{print $2}' | sort -u)
[ ${#bases[@]} -eq 1 ] || fail "stages use different base images: ${bases[*]}"
[[ "${bases[0]}" == *:* && "${bases[0]}" != *:latest ]] || fail "base image ${bases[0]} is not pinned"
grep -qE '^USER [1-9][0-9]*(:[0-9]+)?$' "$DOCKERFILE" || fail "runtime USER is root or missing"
grep -q 'cmake --install /build' "$DOCKERFILE" || fail "build stage does not install with cmake --install"
for f in dlcpd dlcpctl libdlcp.so; do grep -q "$f" "$DOCKERFILE" || fail "image does not ship $f"; done

listed=$(awk '!/^#/ && NF {print $1}' "$LIST" | sort -u)
TRAINER="$ROOT/deploy/docker/trainer-packages.txt"
grep -q 'AS trainer' "$DOCKERFILE" && grep -q 'COPY --from=build /out/python/dlcp/' "$DOCKERFILE" \
  || fail "no trainer stage shipping the Python package"
# Packages are looked up in one dpkg or apt-cache call each time, not one per package: each call
# reads the whole database, and one per package made this check take a minute of CI.
exist_in_debian() {
  apt-cache show "$@" >/dev/null 2>&1 && return
  for pkg in "$@"; do apt-cache show "$pkg" >/dev/null 2>&1 || fail "package $pkg does not exist in this Debian"; done
}
trainer=$(grep -v '^#' "$TRAINER")
for pkg in $trainer; do
  grep -qE "(^|[[:space:]])$pkg([[:space:]]|$)" "$ROOT/scripts/install-deps.sh" || fail "trainer package $pkg is not in install-deps.sh"
done
exist_in_debian $trainer
binaries=("$BUILD/server/dlcpd" "$BUILD/client/dlcpctl" "$BUILD/client/libdlcp.so")
ext=$(ls "$BUILD"/python/dlcp/_dlcp*.so 2>/dev/null | head -1)
[ -n "$ext" ] && binaries+=("$ext")
# ldd may name a library by its /lib path, which dpkg (merged /usr) may know only under /usr/lib.
mapfile -t libs < <(ldd "${binaries[@]}" | awk '/=>/{print $3}' | sort -u)
owners=$(dpkg -S "${libs[@]}" "${libs[@]/#//usr}" 2>/dev/null || true)
needed=""
for p in "${libs[@]}"; do
  owner=$(awk -F': ' -v p="$p" '$2 == p || $2 == "/usr" p {print $1; exit}' <<< "$owners")
  [ -n "$owner" ] || fail "no Debian package owns $p"
  needed+="${owner%%:*}"$'\n'
done
needed=$(sort -u <<< "$needed" | grep -vxE 'libc6|libgcc-s1|libstdc\+\+6|')
# What ldd cannot see: libraries the binaries dlopen(), and those libraries' plugins.
while read -r pkg _ kind a b; do
  case "$kind" in
    dlopen)
      grep -qaF "$a" "$BUILD/server/dlcpd" || fail "$pkg is listed for $a, which dlcpd does not load"
      dpkg -L "$pkg" 2>/dev/null | grep -q "/$a\$" || fail "$pkg does not ship $a"
      ;;
    plugins)
      [ "$a" = of ] && grep -qx "$b" <<< "$listed" || fail "$pkg is listed as plugins of $b, which is not listed"
      ;;
    *) fail "runtime-packages.txt: cannot read the note on $pkg" ;;
  esac
  needed=$(printf '%s\n%s' "$needed" "$pkg" | sort -u)
done < <(grep -E '^[a-z0-9.+-]+[[:space:]]+#' "$LIST")
missing=$(comm -23 <(echo "$needed") <(echo "$listed"))
unused=$(comm -13 <(echo "$needed") <(echo "$listed"))
[ -z "$missing" ] || fail "runtime-packages.txt lacks: $missing"
[ -z "$unused" ] || fail "runtime-packages.txt lists packages no binary loads: $unused"
exist_in_debian $listed
echo "lockstep: Dockerfile, install-deps.sh and runtime-packages.txt agree with the binaries ($(echo $listed | wc -w) runtime packages)"
