#!/usr/bin/env bash
# Boots a throw-away qemu VM whose kernel has Soft-RoCE (rdma_rxe), creates rxe0 on a dummy
# interface (10.0.0.1), runs a guest script there as root, and copies back what it writes.
# It lets the RDMA transport run against real verbs on a machine without RDMA hardware.
#
#   rxevm.sh [--copy PATH]... [--out DIR] [--cache DIR] [--timeout S] [--nic TAP,IP/LEN,GW] -f GUEST_SCRIPT
#
# - --nic gives the VM a virtio NIC on the host's tap device TAP (made beforehand, e.g. with
#   `ip tuntap add TAP mode tap`, in the network namespace this script runs in), addressed
#   IP/LEN with its default route via GW, and puts rxe0 on it instead of the dummy interface:
#   RoCEv2 packets then leave the VM and cross whatever the host builds behind TAP (a multipath
#   fabric: bench/rdma_multipath.sh).
# - The guest kernel is Debian's linux-image-amd64, fetched with `apt-get download` into the
#   cache and unpacked (never installed); the initramfs is busybox plus the kernel modules rxe
#   needs and the host's libibverbs with its rxe provider.
# - --copy puts a host file or directory at the same absolute path in the guest, with the
#   shared libraries its ELF files need (dlopen()ed ones are not followed: libibverbs is in the
#   base image).
# - The guest script runs under busybox `sh -e` with RXE_DEV, RXE_IP, RXE_NETDEV and RXE_GID_INDEX set;
#   files it writes to /rxevm/out come back to --out through a second serial port.
# - KVM is used when the CPU offers it, TCG otherwise (about 10 s to boot).
# Exit status: the guest script's; 124 on timeout; 125 if the VM died without one.
set -euo pipefail

CACHE=${DLCP_RXEVM_CACHE:-/var/tmp/dlcp-rxevm}
TIMEOUT=600 BOOT_TIMEOUT=90 SCRIPT= OUT_DIR= NIC=
COPIES=()
while [ $# -gt 0 ]; do
  case "$1" in
    -f) SCRIPT=$2; shift 2 ;;
    --copy) COPIES+=("$2"); shift 2 ;;
    --out) OUT_DIR=$2; shift 2 ;;
    --cache) CACHE=$2; shift 2 ;;
    --timeout) TIMEOUT=$2; shift 2 ;;
    --nic) NIC=$2; shift 2 ;;
    *) echo "rxevm: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$SCRIPT" ] || { echo "rxevm: -f GUEST_SCRIPT is required" >&2; exit 2; }
log() { echo "[rxevm] $*" >&2; }
MA=x86_64-linux-gnu

# ---- staging helpers: files land at their canonical path (merged /usr) under a root
stage_file() {
  local src=$1 root=$2 dir
  dir=$(readlink -f "$(dirname "$src")")
  [ -e "$root$dir/$(basename "$src")" ] && return 0
  mkdir -p "$root$dir"
  cp -L --preserve=mode "$src" "$root$dir/$(basename "$src")"
}
is_elf() { [ -f "$1" ] && [ "$(head -c4 "$1" | od -An -c | tr -d ' ')" = '177ELF' ]; }
stage_with_deps() {
  local f=$1 root=$2 d
  stage_file "$f" "$root"
  is_elf "$f" || return 0
  for d in $(ldd "$f" 2>/dev/null | awk '/=> \//{print $3} /^[[:space:]]*\/[^ ]+ \(/{print $1}'); do
    stage_file "$d" "$root"
  done
}

# ---- base assets: kernel, modules, busybox, verbs user space; built once per kernel version
build_base() {
  local kpkg kver kdeb kdir root kroot order=" "
  mkdir -p "$CACHE/debs"
  kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  [ -n "$kpkg" ] || { log "cannot resolve linux-image-amd64 (apt-get update?)"; exit 1; }
  kver=${kpkg#linux-image-}
  if ! ls "$CACHE"/debs/"${kpkg}"_*.deb >/dev/null 2>&1; then
    log "downloading $kpkg"
    (cd "$CACHE/debs" && apt-get download "$kpkg" >&2)
  fi
  kdeb=$(ls "$CACHE"/debs/"${kpkg}"_*.deb | head -1)
  kdir=$CACHE/kernel-$kver
  if [ ! -f "$kdir/boot/vmlinuz-$kver" ]; then
    rm -rf "$kdir" && mkdir -p "$kdir"
    dpkg-deb --fsys-tarfile "$kdeb" | tar -x -C "$kdir" ./boot "./lib/modules/$kver/kernel"
  fi
  cp "$kdir/boot/vmlinuz-$kver" "$CACHE/vmlinuz"

  root=$CACHE/base-root
  rm -rf "$root"
  mkdir -p "$root"/{usr/bin,usr/sbin,usr/lib/$MA,usr/lib64,proc,sys,dev,tmp,root,etc/libibverbs.d,rxevm/modules,rxevm/out}
  ln -s usr/bin "$root/bin"; ln -s usr/sbin "$root/sbin"; ln -s usr/lib "$root/lib"; ln -s usr/lib64 "$root/lib64"
  chmod 1777 "$root/tmp"
  # Modules in load order, each after what its modinfo says it depends on. crc32_generic backs
  # rxe's ICRC through the crypto API, which modinfo does not list.
  kroot=$kdir/lib/modules/$kver/kernel
  : > "$root/rxevm/modules/order"
  add_mod() {
    local m=$1 p d
    case "$order" in *" $m "*) return 0 ;; esac
    p=$(find "$kroot" \( -name "$m.ko" -o -name "${m//_/-}.ko" \) | head -1)
    [ -n "$p" ] || { log "module $m not in $kdeb"; exit 1; }
    for d in $(grep -a -o -E 'depends=[^[:cntrl:]]*' "$p" | head -1 | cut -d= -f2 | tr , ' '); do add_mod "$d"; done
    cp "$p" "$root/rxevm/modules/"
    basename "$p" >> "$root/rxevm/modules/order"
    order="$order$m "
  }
  for m in crc32_generic rdma_rxe ib_uverbs dummy virtio_pci virtio_net; do add_mod "$m"; done
  cp /bin/busybox "$root/usr/bin/busybox"
  stage_with_deps /usr/bin/rdma "$root"
  stage_with_deps "/usr/lib/$MA/libibverbs.so.1" "$root"  # what dlcp dlopen()s
  stage_with_deps "$(ls /usr/lib/$MA/libibverbs/librxe-rdmav*.so | head -1)" "$root"
  stage_file "/usr/lib/$MA/libgcc_s.so.1" "$root"  # glibc dlopen()s it to unwind threads
  cp /etc/libibverbs.d/rxe.driver "$root/etc/libibverbs.d/"
  printf 'root:x:0:0:root:/root:/bin/sh\n' > "$root/etc/passwd"
  printf 'root:x:0:\n' > "$root/etc/group"
  printf '127.0.0.1 localhost\n10.0.0.1 rxevm\n' > "$root/etc/hosts"
  cat > "$root/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TMPDIR=/tmp
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/shm; mount -t tmpfs tmpfs /dev/shm
say() { echo "[rxevm-guest] $*"; }
fail() { say "SETUP FAILED: $*"; echo "RXEVM_EXIT_STATUS=125"; poweroff -f; }
say "up $(cut -d' ' -f1 /proc/uptime)s"
for m in $(cat /rxevm/modules/order); do insmod /rxevm/modules/$m || fail "insmod $m"; done
ip link set lo up
if [ -s /rxevm/nic ]; then  # --nic: "IP/LEN GW" on the virtio NIC
  read -r NIC_ADDR NIC_GW < /rxevm/nic
  DEV=eth0 IP=${NIC_ADDR%/*}
  ip link set $DEV up || fail "no NIC eth0"
  ip addr add $NIC_ADDR dev $DEV
  ip route add default via $NIC_GW
else
  DEV=dummy0 IP=10.0.0.1
  ip link add dummy0 type dummy 2>/dev/null; ip link set dummy0 up
  ip addr add 10.0.0.1/24 dev dummy0
fi
rdma link add rxe0 type rxe netdev $DEV || fail "rdma link add"
G=/sys/class/infiniband/rxe0/ports/1; i=0; GIDX=
while [ $i -lt 100 ] && [ -z "$GIDX" ]; do
  for f in $G/gids/*; do
    n=${f##*/}
    case "$(cat $f 2>/dev/null)" in 0000:0000:0000:0000:0000:ffff:*)
      [ "$(cat $G/gid_attrs/types/$n 2>/dev/null)" = "RoCE v2" ] && GIDX=$n && break ;; esac
  done
  i=$((i+1)); [ -n "$GIDX" ] || sleep 0.1
done
[ -n "$GIDX" ] || fail "no IPv4 RoCEv2 GID on rxe0"
ulimit -l unlimited
export RXE_DEV=rxe0 RXE_IP=$IP RXE_NETDEV=$DEV RXE_GID_INDEX=$GIDX
say "rxe0 ready on $DEV $IP, RoCEv2 GID index $GIDX"
cd /
sh -e /rxevm/cmd.sh
rc=$?
if [ -n "$(ls -A /rxevm/out 2>/dev/null)" ]; then
  stty -F /dev/ttyS1 raw -echo 2>/dev/null
  { echo RXEVM_OUT_BEGIN; tar -C /rxevm/out -cf - . | base64; echo RXEVM_OUT_END; } > /dev/ttyS1
fi
echo "RXEVM_EXIT_STATUS=$rc"
sync; poweroff -f
EOF
  chmod 755 "$root/init"
  (cd "$root" && find . | cpio -o -H newc --quiet | gzip -1 > "$CACHE/base.cpio.gz")
  echo "$STAMP $kpkg" > "$CACHE/base.stamp"
  log "base assets ready (kernel $kver)"
}

mkdir -p "$CACHE"
STAMP=$(sha256sum "$0" | cut -c1-16)  # a changed script rebuilds the base image
grep -qs "^$STAMP " "$CACHE/base.stamp" && [ -f "$CACHE/base.cpio.gz" ] && [ -f "$CACHE/vmlinuz" ] || build_base

WORK=$(mktemp -d "${TMPDIR:-/tmp}/rxevm.XXXXXX")
QPID=
cleanup() { [ -n "$QPID" ] && kill "$QPID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
mkdir -p "$WORK/root/rxevm"
cp "$SCRIPT" "$WORK/root/rxevm/cmd.sh"
NET_ARGS=(-net none)
if [ -n "$NIC" ]; then
  IFS=, read -r NIC_TAP NIC_ADDR NIC_GW <<< "$NIC"
  [ -n "$NIC_TAP" ] && [ -n "$NIC_ADDR" ] && [ -n "$NIC_GW" ] || { echo "rxevm: --nic wants TAP,IP/LEN,GW" >&2; exit 2; }
  echo "$NIC_ADDR $NIC_GW" > "$WORK/root/rxevm/nic"
  # A MAC of the address's own, so VMs on one fabric differ.
  NIC_MAC=$(printf '52:54:00:%02x:%02x:%02x' $(echo "${NIC_ADDR%/*}" | awk -F. '{print $2, $3, $4}'))
  NET_ARGS=(-netdev "tap,id=n0,ifname=$NIC_TAP,script=no,downscript=no" -device "virtio-net-pci,netdev=n0,mac=$NIC_MAC")
fi
for c in "${COPIES[@]+"${COPIES[@]}"}"; do
  if [ -d "$c" ]; then
    while IFS= read -r -d '' f; do stage_with_deps "$f" "$WORK/root"; done < <(find "$(readlink -f "$c")" -type f -print0)
  else
    stage_with_deps "$(readlink -f "$c")" "$WORK/root"
  fi
done
(cd "$WORK/root" && find . | cpio -o -H newc --quiet | gzip -1 > "$WORK/run.cpio.gz")
cat "$CACHE/base.cpio.gz" "$WORK/run.cpio.gz" > "$WORK/initrd.gz"

ACCEL=tcg CPU=max
if [ -r /dev/kvm ] && [ -w /dev/kvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo; then ACCEL=kvm CPU=host; fi
log "booting ($ACCEL)"
: > "$WORK/console.log"
timeout -k 5 "$TIMEOUT" qemu-system-x86_64 -accel "$ACCEL" -cpu "$CPU" -smp 2 -m 1024 -nodefaults -no-reboot \
  -display none -kernel "$CACHE/vmlinuz" -initrd "$WORK/initrd.gz" \
  -append "console=ttyS0 panic=-1 rdinit=/init quiet loglevel=3" \
  -serial "file:$WORK/console.log" -serial "file:$WORK/ttyS1.log" "${NET_ARGS[@]}" \
  < /dev/null > /dev/null 2> "$WORK/qemu.err" &
QPID=$!
tail -n +1 -s 0.2 -f --pid="$QPID" "$WORK/console.log" | sed -u 's/\r//g' &
waited=0
while kill -0 "$QPID" 2>/dev/null && ! grep -q '^\[rxevm-guest\] up' "$WORK/console.log"; do
  sleep 0.5; waited=$((waited + 1))
  if [ "$waited" -ge $((BOOT_TIMEOUT * 2)) ]; then log "no guest output after ${BOOT_TIMEOUT}s"; kill "$QPID"; break; fi
done
QRC=0; wait "$QPID" || QRC=$?
QPID=
sleep 0.3
STATUS=$(tr -d '\r' < "$WORK/console.log" | sed -n 's/^RXEVM_EXIT_STATUS=\([0-9]*\)$/\1/p' | tail -1)
if [ -n "$OUT_DIR" ] && grep -q RXEVM_OUT_BEGIN "$WORK/ttyS1.log" 2>/dev/null; then
  mkdir -p "$OUT_DIR"
  tr -d '\r' < "$WORK/ttyS1.log" | sed -n '/^RXEVM_OUT_BEGIN$/,/^RXEVM_OUT_END$/p' | sed '1d;$d' | base64 -d | tar -C "$OUT_DIR" -xf -
fi
if [ -z "$STATUS" ]; then
  sed 's/^/[qemu] /' "$WORK/qemu.err" >&2
  if [ "$QRC" = 124 ] || [ "$QRC" = 137 ]; then log "timeout after ${TIMEOUT}s"; exit 124; fi
  exit 125
fi
exit "$STATUS"
