#!/usr/bin/env bash
# multipath.sh - an emulated two-rack cluster with several equal-cost paths between the racks,
# for dlcp's path spraying (docs/path-spraying.md).
#
#   workers w1..wN ── leaf router <P>-lw ══ spine <P>-s1 ══ leaf router <P>-la ── aggregators a1..aM
#                                        ══ spine <P>-s2 ══
#                                        ...  (PATHS spines)
#
# The leaves route between the racks over every spine with a Linux ECMP multipath route and
# fib_multipath_hash_policy=1, which hashes on the L4 5-tuple: one UDP flow takes one path, and
# a sender only spreads over paths by changing its source port. Each spine's two egress ports
# (towards either rack) are bottlenecks of their path's rate with the same strict-priority DSCP
# queues as cluster.sh (scripts/netbed/qos.sh). Host links are not shaped.
#
# Usage:  multipath.sh up | down | bytes | drops | rate <spine> <rate> | hosts | ip <host>
#   bytes: per spine, the bytes its two egress ports sent
#          ("s1 to_aggregators=... to_workers=...").
#   drops: per spine, the packets its two egress ports' class queues dropped, in the same form.
#   rate:  shapes both egress ports of spine K (1..PATHS) to a new rate, e.g. "rate 2 100mbit"
#          (their counters start again from zero).
# Env (defaults):
#   PREFIX=mp  NWORKERS=4  NAGGS=2  PATHS=2  RATES="1gbit 1gbit" (one per path; the last repeats)
#   QLEN_PKTS=64  MTU=1500  DSCP_CLASSES="46 34 18"  CLASSIFIER=u32  NET=10.71
#   FAMILY=4 (6: the same bed over IPv6 alone, fd71:... addresses, the leaves' ECMP hashing the
#   IPv6 5-tuple; CLASSIFIER u32 only)  NET6=fd71
#   STATE_DIR=/tmp/multipath (remembers which namespaces this script created)
set -Eeuo pipefail

PREFIX=${PREFIX:-mp}
NWORKERS=${NWORKERS:-4}
NAGGS=${NAGGS:-2}
PATHS=${PATHS:-2}
RATES=${RATES:-"1gbit"}
QLEN_PKTS=${QLEN_PKTS:-64}
QLEN_BYTES=${QLEN_BYTES:-}
MTU=${MTU:-1500}
DSCP_CLASSES=${DSCP_CLASSES:-"46 34 18"}
CLASSIFIER=${CLASSIFIER:-u32}
NET=${NET:-10.71}
FAMILY=${FAMILY:-4}
NET6=${NET6:-fd71}
STATE_DIR=${STATE_DIR:-/tmp/multipath}
STATE="$STATE_DIR/multipath-$PREFIX.ns"
HMAJ=10

die() { echo "multipath.sh: ERROR: $*" >&2; exit 1; }
# shellcheck source=scripts/netbed/qos.sh
source "$(dirname "$(readlink -f "$0")")/qos.sh"

[[ $PREFIX =~ ^[a-z][a-z0-9]{0,5}$ ]] || die "PREFIX must be 1-6 chars [a-z0-9], starting with a letter"
[[ $NWORKERS =~ ^[0-9]+$ && $NAGGS =~ ^[0-9]+$ && $PATHS =~ ^[0-9]+$ ]] || die "NWORKERS, NAGGS, PATHS: integers"
(( NWORKERS >= 1 && NWORKERS <= 80 && NAGGS >= 1 && NAGGS <= 80 && PATHS >= 1 && PATHS <= 8 )) \
  || die "need 1..80 workers, 1..80 aggregators and 1..8 paths"
[[ $FAMILY == 4 || ($FAMILY == 6 && $CLASSIFIER == u32) ]] || die "FAMILY must be 4, or 6 with CLASSIFIER=u32"
read -r -a DSCPS <<< "$DSCP_CLASSES"
NCLS=$(( ${#DSCPS[@]} + 1 ))
read -r -a RATE_LIST <<< "$RATES"
(( ${#RATE_LIST[@]} >= 1 )) || die "RATES is empty"

ns() { echo "$PREFIX-$1"; }
# addr RACK_OR_LINK HOST_PART: an address of the family, e.g. "addr 1 11" is 10.71.1.11 or fd71:1::11.
addr() { if [[ $FAMILY == 6 ]]; then echo "$NET6:$1::$2"; else echo "$NET.$1.$2"; fi; }
subnet() { if [[ $FAMILY == 6 ]]; then echo "$NET6:$1::/64"; else echo "$NET.$1.0/24"; fi; }
plen() { if [[ $FAMILY == 6 ]]; then echo 64; else echo 24; fi; }
NODAD=$([[ $FAMILY == 6 ]] && echo nodad || true)  # IPv6 addresses usable at once, no duplicate check
host_ip() { case $1 in w*) addr 1 $((10 + ${1#w})) ;; a*) addr 2 $((100 + ${1#a})) ;; *) die "unknown host $1" ;; esac; }
path_rate() { local i=$(( $1 - 1 )); (( i < ${#RATE_LIST[@]} )) || i=$(( ${#RATE_LIST[@]} - 1 )); echo "${RATE_LIST[$i]}"; }
hosts() { local i; for ((i = 1; i <= NWORKERS; i++)); do echo "w$i"; done; for ((i = 1; i <= NAGGS; i++)); do echo "a$i"; done; }
all_ns() { hosts; echo lw; echo la; local k; for ((k = 1; k <= PATHS; k++)); do echo "s$k"; done; }

mk_ns() {
  local n; n=$(ns "$1")
  if [[ -e /run/netns/$n ]]; then
    grep -qx -- "$n" "$STATE" 2>/dev/null || die "namespace $n exists but was not created by this script; refusing to touch it"
    ip netns del "$n"
  fi
  ip netns add "$n"
  grep -qx -- "$n" "$STATE" 2>/dev/null || echo "$n" >> "$STATE"
  ip -n "$n" link set lo up
  ip netns exec "$n" sh -c "echo $((FAMILY == 4)) > /proc/sys/net/ipv6/conf/all/disable_ipv6;
    echo $((FAMILY == 4)) > /proc/sys/net/ipv6/conf/default/disable_ipv6; echo 0 > /proc/sys/net/ipv6/conf/all/accept_dad;
    echo 0 > /proc/sys/net/ipv6/conf/default/accept_dad; echo 0 > /proc/sys/net/ipv4/conf/all/rp_filter;
    echo 0 > /proc/sys/net/ipv4/conf/default/rp_filter"
}

# link A DEV_A IP_A/LEN B DEV_B IP_B/LEN: a veth pair, offloads off so shapers see wire-sized packets.
link() {
  ip link add "$2" netns "$(ns "$1")" mtu "$MTU" type veth peer name "$5" netns "$(ns "$4")" mtu "$MTU"
  local side
  for side in "$1 $2 $3" "$4 $5 $6"; do
    set -- $side
    ip -n "$(ns "$1")" link set "$2" up
    [[ $3 == - ]] || ip -n "$(ns "$1")" addr add "$3" dev "$2" $NODAD
    ip netns exec "$(ns "$1")" ethtool -K "$2" tso off gso off gro off >/dev/null 2>&1 || die "ethtool -K in $(ns "$1")"
  done
}

router() {  # forwarding, with ECMP hashing on L4 ports
  ip netns exec "$(ns "$1")" sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward;
    echo 1 > /proc/sys/net/ipv4/fib_multipath_hash_policy'
  [[ $FAMILY == 4 ]] || ip netns exec "$(ns "$1")" sh -c 'echo 1 > /proc/sys/net/ipv6/conf/all/forwarding;
    echo 1 > /proc/sys/net/ipv6/fib_multipath_hash_policy'
}

cmd_up() {
  [[ $(id -u) == 0 ]] || die "must run as root"
  command -v ethtool >/dev/null || die "ethtool not found (apt-get install ethtool)"
  mkdir -p "$STATE_DIR"; touch "$STATE"
  cmd_down quiet
  local n h k rate_b burst_b lw_hops=() la_hops=()
  for n in $(all_ns); do mk_ns "$n"; done
  for n in lw la; do
    router "$n"
    ip -n "$(ns "$n")" link add br0 type bridge stp_state 0
    ip -n "$(ns "$n")" link set br0 mtu "$MTU" up
  done
  ip -n "$(ns lw)" addr add "$(addr 1 1)/$(plen)" dev br0 $NODAD
  ip -n "$(ns la)" addr add "$(addr 2 1)/$(plen)" dev br0 $NODAD
  for h in $(hosts); do
    local leaf=lw; [[ $h == a* ]] && leaf=la
    link "$h" eth0 "$(host_ip "$h")/$(plen)" "$leaf" "p-$h" -
    ip -n "$(ns "$leaf")" link set "p-$h" master br0
    ip -n "$(ns "$h")" route add default via "$(addr "$([[ $h == a* ]] && echo 2 || echo 1)" 1)"
  done
  for ((k = 1; k <= PATHS; k++)); do
    router "s$k"
    link lw "sp$k" "$(addr $((10 + k)) 1)/$(plen)" "s$k" rw "$(addr $((10 + k)) 2)/$(plen)"
    link "s$k" ra "$(addr $((20 + k)) 1)/$(plen)" la "sp$k" "$(addr $((20 + k)) 2)/$(plen)"
    ip -n "$(ns "s$k")" route add "$(subnet 2)" via "$(addr $((20 + k)) 2)"
    ip -n "$(ns "s$k")" route add "$(subnet 1)" via "$(addr $((10 + k)) 1)"
    shape_spine "$k" "$(path_rate "$k")"
    lw_hops+=(nexthop via "$(addr $((10 + k)) 2)" dev "sp$k" weight 1)
    la_hops+=(nexthop via "$(addr $((20 + k)) 1)" dev "sp$k" weight 1)
  done
  ip -n "$(ns lw)" route add "$(subnet 2)" "${lw_hops[@]}"
  ip -n "$(ns la)" route add "$(subnet 1)" "${la_hops[@]}"
  # A first ping can be lost while IPv6 resolves the routers' neighbours: a few tries.
  local try
  for try in 1 2 3; do
    ip netns exec "$(ns w1)" ping -c 1 -W 2 "$(host_ip a1)" >/dev/null && break
    (( try < 3 )) || die "w1 cannot reach a1 across the spines"
  done
  echo "multipath '$PREFIX' up: $NWORKERS workers, $NAGGS aggregators, $PATHS paths ($(for ((k = 1; k <= PATHS; k++)); do printf '%s ' "$(path_rate "$k")"; done)), ECMP on L4, IPv$FAMILY"
}

# shape_spine K RATE: both egress ports of spine K, with a bucket of 200 us at the rate (4 frames
# at least).
shape_spine() {
  local rate_b burst_b
  rate_bps rate_b "$2"
  burst_b=$(( rate_b / 8 / 5000 )); (( burst_b >= 4 * (MTU + 14) )) || burst_b=$(( 4 * (MTU + 14) ))
  setup_port_qos "$(ns "s$1")" ra "$rate_b" "$burst_b"
  setup_port_qos "$(ns "s$1")" rw "$rate_b" "$burst_b"
}

cmd_rate() {
  [[ ${1:-} =~ ^[0-9]+$ ]] && (( $1 >= 1 && $1 <= PATHS )) || die "rate: spine must be 1..$PATHS"
  [[ -e /run/netns/$(ns "s$1") ]] || die "rate: spine $1 is not up"
  shape_spine "$1" "${2:?rate}"
}

cmd_down() {
  local n
  [[ -f $STATE ]] || return 0
  while read -r n; do [[ -n $n && -e /run/netns/$n ]] && ip netns del "$n"; done < "$STATE"
  : > "$STATE"
  [[ ${1:-} == quiet ]] || echo "multipath '$PREFIX' down"
}

cmd_bytes() {
  local k to_workers to_aggs
  for ((k = 1; k <= PATHS; k++)); do
    to_aggs=$(ip netns exec "$(ns "s$k")" cat /sys/class/net/ra/statistics/tx_bytes)
    to_workers=$(ip netns exec "$(ns "s$k")" cat /sys/class/net/rw/statistics/tx_bytes)
    echo "s$k to_aggregators=$to_aggs to_workers=$to_workers"
  done
}

# The drops of one egress port: the sum over its per-class leaf queues.
port_drops() {
  ip netns exec "$(ns "$1")" tc -s qdisc show dev "$2" |
    awk '/^qdisc (pfifo|bfifo)/{leaf=1; next} /^qdisc/{leaf=0} leaf && /dropped/{sub(/.*dropped /,""); sub(/,.*/,""); n+=$0} END{print n+0}'
}

cmd_drops() {
  local k
  for ((k = 1; k <= PATHS; k++)); do
    echo "s$k to_aggregators=$(port_drops "s$k" ra) to_workers=$(port_drops "s$k" rw)"
  done
}

case ${1:-} in
  up) cmd_up ;;
  down) cmd_down ;;
  bytes) cmd_bytes ;;
  drops) cmd_drops ;;
  rate) cmd_rate "${2:-}" "${3:-}" ;;
  hosts) hosts ;;
  ip) host_ip "${2:?host}" ;;
  *) sed -n '2,/^set -E/p' "$0" | sed '$d;s/^# \{0,1\}//' >&2; exit 2 ;;
esac
