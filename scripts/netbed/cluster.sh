#!/usr/bin/env bash
# cluster.sh - emulated cluster for dlcp (adapted from the workplace netbed reference).
#
# K hosts (network namespaces <PREFIX>-w1..wN workers, <PREFIX>-a1..aM aggregators)
# hang off one emulated switch: a Linux bridge in namespace <PREFIX>-sw.
# Every switch egress port (the veth end "p-<host>" in <PREFIX>-sw, i.e. the link
# towards the host) is a bottleneck of rate RATE with STRICT PRIORITY by DSCP:
#
#   root 1:  tbf  rate $RATE burst $BURST            <- the link rate (shaper)
#    `-10:   htb  default 4                           <- strict-priority scheduler:
#        10:1 prio 0  DSCP 46 (EF)  + ARP  -> pfifo/bfifo   every class has rate=ceil=4*RATE,
#        10:2 prio 1  DSCP 34 (AF41)       -> pfifo/bfifo   so all are always "green" and HTB
#        10:3 prio 2  DSCP 18 (AF21)       -> pfifo/bfifo   serves them strictly by prio; the
#        10:4 prio 3  everything else (BE) -> pfifo/bfifo   tbf above enforces the total rate.
#   Each class has its own drop-tail FIFO of QLEN_PKTS packets (or QLEN_BYTES bytes).
#   (sch_prio / netem / mqprio / flower are not in this kernel; this uses only
#    tbf + htb + fifo + u32 or cls_bpf(classic BPF), which are.)
#
# Usage:  cluster.sh up | down | status | stats [host..] | exec <host> <cmd..>
#                    | cross <src> <dst> [rate] [dscp] [secs] [udp|tcp] [port] | hosts
# Env (defaults):
#   PREFIX=tb  NWORKERS=4  NAGGS=1  RATE=1gbit (bit|kbit|mbit|gbit, or K/M/G suffix)
#   QLEN_PKTS=64 (per-class pfifo)   QLEN_BYTES= (if set: per-class bfifo, overrides QLEN_PKTS)
#   BURST=auto (tbf bucket bytes; auto = max(4*MTU, 200us at RATE))
#   DSCP_CLASSES="46 34 18" (DSCP of class 1..3; anything else -> class 4; max 7 entries)
#   CLASSIFIER=u32|bpf   SUBNET=198.18.0 (/24; workers .11.., aggregators .101..)
#   MTU=1500  OFFLOAD=off (tso/gso/gro off on host NICs via ethtool; "on" keeps defaults)
#   HOST_RATE= (optional: plain tbf on each host's own uplink, e.g. 1gbit)
#   STATE_DIR=/tmp/testbed (remembers which namespaces this script created)
# Exit codes: 0 ok, 1 error, 2 usage, 3 status: cluster (partly) down.
set -Eeuo pipefail

PREFIX=${PREFIX:-tb}
NWORKERS=${NWORKERS:-4}
NAGGS=${NAGGS:-1}
RATE=${RATE:-1gbit}
QLEN_PKTS=${QLEN_PKTS:-64}
QLEN_BYTES=${QLEN_BYTES:-}
BURST=${BURST:-auto}
DSCP_CLASSES=${DSCP_CLASSES:-"46 34 18"}
CLASSIFIER=${CLASSIFIER:-u32}
SUBNET=${SUBNET:-198.18.0}
MTU=${MTU:-1500}
OFFLOAD=${OFFLOAD:-off}
HOST_RATE=${HOST_RATE:-}
STATE_DIR=${STATE_DIR:-/tmp/testbed}
STATE="$STATE_DIR/cluster-$PREFIX.ns"
SW="$PREFIX-sw"
HMAJ=10   # htb handle (hex 0x10)
# shellcheck source=scripts/netbed/qos.sh
source "$(dirname "$(readlink -f "$0")")/qos.sh"

die()  { echo "cluster.sh: ERROR: $*" >&2; exit 1; }
usage(){ awk 'NR>1 && /^#/{sub(/^# ?/,""); print; next} NR>1{exit}' "$0" >&2; exit "${1:-2}"; }
trap 'rc=$?; (( rc == 141 )) && exit 141;   # SIGPIPE (output piped into head): not an error
      echo "cluster.sh: ERROR: command failed (rc=$rc) at line $LINENO: $BASH_COMMAND" >&2; exit 1' ERR

need() { command -v "$1" >/dev/null 2>&1 || die "'$1' not found (apt-get install -y $2)"; }

# --- parameter parsing / validation -------------------------------------------------
is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }

validate() {
  [[ $PREFIX =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "PREFIX must be 1-8 chars [a-z0-9], starting with a letter"
  is_uint "$NWORKERS" && is_uint "$NAGGS" || die "NWORKERS/NAGGS must be integers"
  (( NWORKERS + NAGGS >= 2 && NWORKERS + NAGGS <= 80 && NWORKERS <= 89 && NAGGS <= 99 )) \
    || die "need 2..80 hosts in total (NWORKERS=$NWORKERS NAGGS=$NAGGS)"
  rate_bps RATE_BPS "$RATE"
  (( RATE_BPS >= 100000 )) || die "RATE too small ($RATE)"
  if [[ -n $QLEN_BYTES ]]; then
    is_uint "$QLEN_BYTES" && (( QLEN_BYTES >= MTU + 14 )) || die "QLEN_BYTES must be an integer >= MTU+14"
  else
    is_uint "$QLEN_PKTS" && (( QLEN_PKTS >= 1 )) || die "QLEN_PKTS must be a positive integer"
  fi
  is_uint "$MTU" && (( MTU >= 576 && MTU <= 9000 )) || die "MTU must be 576..9000"
  if [[ $BURST == auto ]]; then
    BURST_B=$(( RATE_BPS / 8 / 5000 ))          # 200 us worth of bytes
    (( BURST_B < 4 * (MTU + 14) )) && BURST_B=$(( 4 * (MTU + 14) ))
  else
    is_uint "$BURST" && (( BURST >= MTU + 14 )) || die "BURST must be 'auto' or bytes >= MTU+14"
    BURST_B=$BURST
  fi
  read -r -a DSCPS <<< "$DSCP_CLASSES"
  (( ${#DSCPS[@]} >= 1 && ${#DSCPS[@]} <= 7 )) || die "DSCP_CLASSES needs 1..7 values"
  local d; for d in "${DSCPS[@]}"; do is_uint "$d" && (( d < 64 )) || die "bad DSCP '$d'"; done
  NCLS=$(( ${#DSCPS[@]} + 1 ))                   # + best-effort class
  [[ $CLASSIFIER == u32 || $CLASSIFIER == bpf ]] || die "CLASSIFIER must be u32 or bpf"
  [[ $SUBNET =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "SUBNET must be the first three octets, e.g. 198.18.0"
  HOST_RATE_BPS=0; [[ -z $HOST_RATE ]] || rate_bps HOST_RATE_BPS "$HOST_RATE"
  [[ $OFFLOAD == on || $OFFLOAD == off ]] || die "OFFLOAD must be on|off"
  mapfile -t HOSTS < <(host_list)
}

# --- naming --------------------------------------------------------------------------
host_list() { local i; for ((i=1;i<=NWORKERS;i++)); do echo "w$i"; done; for ((i=1;i<=NAGGS;i++)); do echo "a$i"; done; }
host_ip()   { case $1 in w*) echo "$SUBNET.$((10 + ${1#w}))";; a*) echo "$SUBNET.$((100 + ${1#a}))";; *) die "unknown host '$1'";; esac; }
ns_of()     { echo "$PREFIX-$1"; }
ns_exists() { [[ -e /run/netns/$1 ]]; }   # ip netns keeps its names in /run/netns
managed()   { [[ -f $STATE ]] && grep -qx -- "$1" "$STATE"; }
valid_host(){ local x; for x in "${HOSTS[@]}"; do [[ $x == "$1" ]] && return 0; done; die "unknown host '$1' (hosts: ${HOSTS[*]})"; }

mk_ns() { # create a namespace we own, or adopt one we created earlier
  local ns=$1
  if ns_exists "$ns"; then
    managed "$ns" || die "namespace $ns exists but was not created by this script (state $STATE); refusing to touch it"
  else
    ip netns add "$ns" || die "ip netns add $ns failed"
    managed "$ns" || echo "$ns" >> "$STATE"
  fi
  ip -n "$ns" link set lo up
  # no IPv6 (no DAD/RS/MLD noise in the queues); written via /proc so procps is not needed
  ip netns exec "$ns" sh -c 'for f in /proc/sys/net/ipv6/conf/all/disable_ipv6 /proc/sys/net/ipv6/conf/default/disable_ipv6; do
    [ -w "$f" ] && echo 1 > "$f"; done; true' 
}

# --- qdisc tree on one switch port: scripts/netbed/qos.sh ----------------------------

# --- subcommands -------------------------------------------------------------------
cmd_up() {
  need ip iproute2; need tc iproute2; need bridge iproute2
  [[ $OFFLOAD == on ]] || need ethtool ethtool
  [[ $(id -u) == 0 ]] || die "must run as root"
  mkdir -p "$STATE_DIR"; touch "$STATE"
  # converge: drop hosts this script created earlier that are not in the current config
  local stale keep=("$SW" "${HOSTS[@]/#/$PREFIX-}") k found
  while read -r stale; do
    [[ -n $stale ]] || continue
    found=0; for k in "${keep[@]}"; do [[ $k == "$stale" ]] && found=1; done
    if (( ! found )); then
      ns_exists "$stale" && ip netns del "$stale"
      grep -vx -- "$stale" "$STATE" > "$STATE.tmp" || true; mv "$STATE.tmp" "$STATE"
      echo "cluster.sh: removed $stale (not in the current config)" >&2
    fi
  done < <(cat "$STATE")
  local n
  for n in "${keep[@]}"; do   # refuse before creating anything if a name is taken by someone else
    ns_exists "$n" && ! managed "$n" && die "namespace $n exists but was not created by this script (state $STATE); refusing to touch it"
  done
  mk_ns "$SW"
  ip -n "$SW" link show br0 >/dev/null 2>&1 || ip -n "$SW" link add br0 type bridge stp_state 0 \
    || die "cannot create bridge (CONFIG_BRIDGE?)"
  ip -n "$SW" link set br0 mtu "$MTU" up
  local h ns ip mac port
  declare -A MAC
  for h in "${HOSTS[@]}"; do
    ns=$(ns_of "$h"); ip=$(host_ip "$h"); port="p-$h"
    mk_ns "$ns"
    if ! ip -n "$SW" link show "$port" >/dev/null 2>&1 || ! ip -n "$ns" link show eth0 >/dev/null 2>&1; then
      ip -n "$SW" link del "$port" 2>/dev/null || true
      ip -n "$ns" link del eth0 2>/dev/null || true
      ip link add "$port" netns "$SW" mtu "$MTU" type veth peer name eth0 netns "$ns" mtu "$MTU" \
        || die "cannot create veth pair for $h (CONFIG_VETH?)"
    fi
    ip -n "$SW" link set "$port" mtu "$MTU" master br0 up
    ip -n "$ns" link set eth0 mtu "$MTU" up
    ip -n "$ns" addr replace "$ip/24" dev eth0
    if [[ $OFFLOAD == off ]]; then
      ip netns exec "$ns" ethtool -K eth0 tso off gso off gro off >/dev/null 2>&1 \
        || die "ethtool -K failed in $ns"
    fi
    if [[ -n $HOST_RATE ]]; then
      ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate "${HOST_RATE_BPS}bit" \
        burst "$BURST_B" limit $(( 100 * (MTU + 14) ))
    else
      ip netns exec "$ns" tc qdisc del dev eth0 root 2>/dev/null || true
    fi
    MAC[$h]=$(ip netns exec "$ns" cat /sys/class/net/eth0/address)
    setup_port_qos "$SW" "$port" "$RATE_BPS" "$BURST_B"
  done
  # static FDB + permanent neighbours: no flooding after FDB ageing, no ARP needed
  for h in "${HOSTS[@]}"; do
    bridge -n "$SW" fdb replace "${MAC[$h]}" dev "p-$h" master static
  done
  for h in "${HOSTS[@]}"; do
    ns=$(ns_of "$h")
    for o in "${HOSTS[@]}"; do
      [[ $o == "$h" ]] && continue
      ip -n "$ns" neigh replace "$(host_ip "$o")" lladdr "${MAC[$o]}" dev eth0 nud permanent
    done
  done
  echo "cluster '$PREFIX' up: ${#HOSTS[@]} hosts, switch=$SW, port rate=${RATE_BPS}bit, burst=${BURST_B}B," \
       "queues=$NCLS x $( [[ -n $QLEN_BYTES ]] && echo "${QLEN_BYTES}B" || echo "${QLEN_PKTS}pkt" ), DSCP classes: ${DSCPS[*]} else BE, classifier=$CLASSIFIER"
}

cmd_down() {
  local ns list=()
  [[ -f $STATE ]] && mapfile -t list < "$STATE"
  for ns in "${list[@]}"; do
    [[ -n $ns ]] || continue
    if ns_exists "$ns"; then ip netns del "$ns" || die "ip netns del $ns failed"; fi
  done
  rm -f "$STATE"
  # report namespaces of the current config that exist but are not ours (never delete them)
  for ns in "$SW" "${HOSTS[@]/#/$PREFIX-}"; do
    ns_exists "$ns" && echo "cluster.sh: note: $ns exists but is not managed by this script; left alone" >&2
  done
  echo "cluster '$PREFIX' down (${#list[@]} namespaces removed)"
}

cmd_status() {
  local ok=1 h ns out
  echo "cluster '$PREFIX' (state: $STATE)"
  if ns_exists "$SW"; then echo "  switch $SW: present"; else echo "  switch $SW: MISSING"; ok=0; fi
  for h in "${HOSTS[@]}"; do
    ns=$(ns_of "$h"); out=""
    ns_exists "$ns" && out=$(ip -n "$ns" -br addr show eth0 2>/dev/null || true)
    if [[ $out == *"$(host_ip "$h")/24"* ]]; then
      printf '  %-4s %-10s %-15s up\n' "$h" "$ns" "$(host_ip "$h")"
    else
      printf '  %-4s %-10s %-15s MISSING\n' "$h" "$ns" "$(host_ip "$h")"; ok=0
    fi
  done
  if (( ok )); then
    for h in "${HOSTS[@]}"; do
      out=$(ip netns exec "$SW" tc qdisc show dev "p-$h" 2>/dev/null || true)
      [[ $out == *"qdisc tbf 1: root"* && $out == *"qdisc htb $HMAJ:"* ]] || { echo "  port p-$h: qdisc MISSING"; ok=0; }
    done
    ip netns exec "$SW" tc qdisc show dev "p-${HOSTS[0]}" | sed 's/^/  /'
    if command -v ping >/dev/null; then
      for h in "${HOSTS[@]:1}"; do
        if ip netns exec "$(ns_of "${HOSTS[0]}")" ping -c1 -W1 -q "$(host_ip "$h")" >/dev/null 2>&1; then
          echo "  ping ${HOSTS[0]} -> $h ok"
        else
          echo "  ping ${HOSTS[0]} -> $h FAILED"; ok=0
        fi
      done
    else
      echo "  (ping not installed: connectivity not probed; apt-get install -y iputils-ping)"
    fi
  fi
  if (( ok )); then echo "status: UP"; return 0; fi
  echo "status: DOWN or incomplete"; trap - ERR; exit 3
}

cmd_stats() { # per-class sent/dropped on switch ports
  local hs=("$@") h
  (( ${#hs[@]} )) || hs=("${HOSTS[@]}")
  for h in "${hs[@]}"; do
    valid_host "$h"
    echo "== port p-$h (egress towards $h) =="
    ip netns exec "$SW" tc -s qdisc show dev "p-$h" | awk '/^qdisc/{q=$2" "$3} /Sent/{sub(/^ +/,""); print "  qdisc " q " " $0}'
    ip netns exec "$SW" tc -s class show dev "p-$h" | awk '/^class htb/{c=$3; p=$0; sub(/.* prio /,"",p); sub(/ .*/,"",p)} /Sent/{print "  class " c " prio " p ": " $0} /backlog/{print "      " $0}'
  done
}

cmd_exec() {
  (( $# >= 2 )) || usage
  local h=$1; shift; valid_host "$h"
  exec ip netns exec "$(ns_of "$h")" "$@"
}

cmd_cross() { # bounded iperf3 cross traffic: src dst [rate] [dscp] [secs] [proto] [port]
  need iperf3 iperf3
  (( $# >= 2 )) || usage
  local src=$1 dst=$2 rate=${3:-2G} dscp=${4:-0} secs=${5:-5} proto=${6:-udp} port=${7:-5299}
  valid_host "$src"; valid_host "$dst"
  is_uint "$secs" && (( secs >= 1 && secs <= 600 )) || die "secs must be 1..600"
  is_uint "$dscp" && (( dscp < 64 )) || die "bad dscp"
  local args=(-c "$(host_ip "$dst")" -p "$port" -t "$secs" --dscp "$dscp" -J)
  case $proto in
    udp) args+=(-u -b "$rate" -l $(( MTU - 28 ))) ;;
    tcp) [[ $rate == 0 ]] || args+=(-b "$rate") ;;
    *) die "proto must be udp or tcp" ;;
  esac
  mkdir -p "$STATE_DIR"
  local log="$STATE_DIR/cross-$PREFIX-$src-$dst-$port.json"
  # The receiving side's report ($log.server) says what arrived, also when the sender is stopped early.
  ip netns exec "$(ns_of "$dst")" timeout $((secs + 15)) iperf3 -s -1 -p "$port" -J >"$log.server" 2>&1 &
  local spid=$!
  sleep 0.5
  ip netns exec "$(ns_of "$src")" timeout $((secs + 10)) iperf3 "${args[@]}" > "$log" 2> "$log.err" || true
  wait "$spid" 2>/dev/null || true
  python3 - "$log" "$proto" "$src" "$dst" "$dscp" <<'PY' || { tail -3 "$log" "$log.err" >&2; die "cross traffic: no iperf3 result"; }
import json, sys
f, proto, s, d, dscp = sys.argv[1:]
e = json.load(open(f))["end"]
if proto == "udp":
    tx, rx = e["sum_sent"], e["sum_received"]
    print(f"cross {s}->{d} udp dscp {dscp}: sent {tx['bits_per_second']/1e6:.1f} Mbit/s, "
          f"received {rx['bits_per_second']/1e6:.1f} Mbit/s, lost {rx['lost_packets']}/{rx['packets']} ({rx['lost_percent']:.1f}%)")
else:
    print(f"cross {s}->{d} tcp dscp {dscp}: received {e['sum_received']['bits_per_second']/1e6:.1f} Mbit/s, "
          f"retransmits {e['sum_sent'].get('retransmits')}")
PY
}

sub=${1:-}; shift || true
case $sub in
  up)     validate; cmd_up ;;
  down)   validate; cmd_down ;;
  status) validate; cmd_status ;;
  stats)  validate; cmd_stats "$@" ;;
  exec)   validate; cmd_exec "$@" ;;
  cross)  validate; cmd_cross "$@" ;;
  hosts)  validate; for h in "${HOSTS[@]}"; do echo "$h $(ns_of "$h") $(host_ip "$h")"; done ;;
  -h|--help|help) usage 0 ;;
  "") usage ;;
  *) echo "cluster.sh: unknown subcommand '$sub'" >&2; usage ;;
esac
