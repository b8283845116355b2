# Sourced by the test bed's scripts (cluster.sh, multipath.sh): rate parsing and the strict-
# priority qdisc tree of one emulated switch port. Callers set MTU, DSCPS (DSCP of classes 1..),
# NCLS (classes + best effort), QLEN_PKTS or QLEN_BYTES, CLASSIFIER (u32|bpf) and HMAJ, and
# define die().

rate_bps() { # rate_bps VAR "1gbit"|"500mbit"|"1G"|"100M"|"123bit" -> VAR=integer bit/s
  local -n _out=$1; local r=${2,,}
  [[ $r =~ ^([0-9]+(\.[0-9]+)?)([kmgt]?)(bit)?$ ]] || die "bad rate '$2' (use e.g. 1gbit, 500mbit, 100M)"
  _out=$(awk -v n="${BASH_REMATCH[1]}" -v u="${BASH_REMATCH[3]}" \
    'BEGIN{m=1; if(u=="k")m=1e3; if(u=="m")m=1e6; if(u=="g")m=1e9; if(u=="t")m=1e12; printf "%.0f", n*m}')
}

# --- qdisc tree on one switch port ------------------------------------------------------
bpf_bytecode() { # classic BPF: ARP -> class 1; IPv4 DSCP d_i -> class i; else default class
  local n=${#DSCPS[@]} i prog=() cls
  prog+=("40 0 0 12")                              # ldh [12]  (ethertype)
  prog+=("21 $((n + 4)) 0 2054")                   # jeq #0x806 -> ret class1
  prog+=("21 0 $((n + 2)) 2048")                   # jeq #0x800 else -> ret default
  prog+=("48 0 0 15")                              # ldb [15]  (TOS byte)
  prog+=("84 0 0 252")                             # and #0xfc (drop ECN bits)
  for ((i=0;i<n;i++)); do prog+=("21 $n 0 $(( DSCPS[i] << 2 ))"); done   # jeq dscp<<2 -> ret class i+1
  prog+=("6 0 0 $(( (0x$HMAJ << 16) | NCLS ))")    # ret default class
  for ((i=1;i<=n;i++)); do prog+=("6 0 0 $(( (0x$HMAJ << 16) | i ))"); done
  local IFS=,; echo "${#prog[@]},${prog[*]}"
}

setup_port_qos() { # NS DEV RATE_BPS BURST_BYTES: the switch-side device of a link, in namespace NS
  # HTB classes: 4x the link rate and a bucket > 2 tbf bursts, so that they never run out of
  # tokens (stay "green"); HTB then only does strict-priority selection, tbf does the shaping.
  local SW=$1 dev=$2 RATE_BPS=$3 BURST_B=$4
  local inner=$(( RATE_BPS * 4 )) hburst=$(( 2 * BURST_B + 2 * (MTU + 14) )) c d
  ip netns exec "$SW" tc qdisc del dev "$dev" root 2>/dev/null || true
  ip netns exec "$SW" tc qdisc add dev "$dev" root handle 1: tbf rate "${RATE_BPS}bit" burst "$BURST_B" limit "$BURST_B"
  ip netns exec "$SW" tc qdisc add dev "$dev" parent 1:1 handle $HMAJ: htb default "$NCLS"
  for ((c=1;c<=NCLS;c++)); do
    ip netns exec "$SW" tc class add dev "$dev" parent $HMAJ: classid $HMAJ:$c htb \
      rate "${inner}bit" ceil "${inner}bit" burst "$hburst" cburst "$hburst" prio $((c - 1)) quantum 60000
    if [[ -n $QLEN_BYTES ]]; then
      ip netns exec "$SW" tc qdisc add dev "$dev" parent $HMAJ:$c handle $((HMAJ + c))0: bfifo limit "$QLEN_BYTES"
    else
      ip netns exec "$SW" tc qdisc add dev "$dev" parent $HMAJ:$c handle $((HMAJ + c))0: pfifo limit "$QLEN_PKTS"
    fi
  done
  if [[ $CLASSIFIER == u32 ]]; then
    for ((c=1;c<NCLS;c++)); do
      d=${DSCPS[c-1]}
      ip netns exec "$SW" tc filter add dev "$dev" parent $HMAJ: protocol ip prio 1 u32 \
        match ip dsfield $(( d << 2 )) 0xfc flowid $HMAJ:$c
    done
    ip netns exec "$SW" tc filter add dev "$dev" parent $HMAJ: protocol arp prio 2 u32 match u32 0 0 flowid $HMAJ:1
    # IPv6: the traffic class, and neighbour discovery (ICMPv6) in the top class, as ARP.
    for ((c=1;c<NCLS;c++)); do
      d=${DSCPS[c-1]}
      ip netns exec "$SW" tc filter add dev "$dev" parent $HMAJ: protocol ipv6 prio 3 u32 \
        match ip6 priority $(( d << 2 )) 0xfc flowid $HMAJ:$c
    done
    ip netns exec "$SW" tc filter add dev "$dev" parent $HMAJ: protocol ipv6 prio 4 u32 match ip6 protocol 58 0xff flowid $HMAJ:1
  else
    ip netns exec "$SW" tc filter add dev "$dev" parent $HMAJ: protocol all prio 1 bpf bytecode "$(bpf_bytecode)"
  fi
}

