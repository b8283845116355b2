# Sourced by the test bed's users (tests/netbed/, bench/netbed_*.sh): a work directory and the
# emulated cluster, both removed on exit together with every background job they started.
# Needs CLUSTER (the path of cluster.sh, or of multipath.sh for the two-rack bed) and PREFIX
# (namespace names, distinct per user).

# The cluster they all use: 4 worker hosts and 1 more host behind a strict-priority switch,
# 1 Gbit/s ports with 64-packet queues unless the environment says otherwise.
export NWORKERS=4 NAGGS=1 RATE=${RATE:-1gbit} QLEN_PKTS=${QLEN_PKTS:-64}

# netbed_skip_unless_able NAME TOOL...: exits 77 (ctest: skipped), saying why as NAME, unless this
# is root, every TOOL is installed and network namespaces can be made.
netbed_skip_unless_able() {
  local name=$1 t
  shift
  if [[ $(id -u) != 0 ]]; then echo "$name: needs root; skipped"; exit 77; fi
  for t in "$@"; do
    command -v "$t" >/dev/null || { echo "$name: $t missing (scripts/install-deps.sh installs it); skipped"; exit 77; }
  done
  ip netns add dlcp-probe 2>/dev/null && ip netns del dlcp-probe || { echo "$name: cannot create namespaces; skipped"; exit 77; }
}

netbed_cleanup() {
  jobs -p | xargs -r kill 2>/dev/null || true
  wait 2>/dev/null || true
  "$CLUSTER" down >/dev/null 2>&1 || true
  [[ -n ${KEEP_WORK:-} ]] || rm -rf "$work"
}

# netbed_start NAME: sets $work, brings the cluster up (its state in /tmp/NAME unless STATE_DIR
# says otherwise), and cleans both up on exit.
netbed_start() {
  export STATE_DIR=${STATE_DIR:-/tmp/$1}
  work=$(mktemp -d "/tmp/$1.XXXXXX")
  trap netbed_cleanup EXIT
  "$CLUSTER" up >/dev/null
}

# netbed_wait_ready FILE: true once a dlcpd --ready-file has been written (10 s at most).
netbed_wait_ready() {
  local _
  for _ in $(seq 1 100); do [[ -s $1 ]] && return 0; sleep 0.1; done
  return 1
}

# netbed_port_bytes HOST...: the bytes each host's eth0 has sent and received so far, "tx rx"
# for each host in turn, on one line.
netbed_port_bytes() {
  local h
  for h in "$@"; do
    ip netns exec "$PREFIX-$h" cat /sys/class/net/eth0/statistics/tx_bytes /sys/class/net/eth0/statistics/rx_bytes
  done | paste -sd' '
}

# The address of worker host wN in the emulated cluster.
netbed_ip_of() { echo "198.18.0.$((10 + $1))"; }

# netbed_aggregators BUILD "HOST:ADDRESS ..." [dlcpd flags...]: a dlcpd in each host's namespace
# (control port 7400, data port 7500, plaintext); waits until all serve. Sets agg_list
# (address:7400,... with IPv6 addresses bracketed) and agg_pids; their logs are $work/HOST.log.
netbed_aggregators() {
  local build=$1 spec h list=()
  local -a specs
  read -r -a specs <<< "$2"
  shift 2
  agg_pids=()
  for spec in "${specs[@]}"; do
    h=${spec%%:*}
    rm -f "$work/$h.ready"
    ip netns exec "$PREFIX-$h" "$build/server/dlcpd" --host="${spec#*:}" --port=7400 --data-port=7500 --plaintext \
      --log-level=warning --ready-file="$work/$h.ready" --host-socket="$work/$h.sock" "$@" 2>"$work/$h.log" &
    agg_pids+=($!)
    if [[ ${spec#*:} == *:* ]]; then list+=("[${spec#*:}]:7400"); else list+=("${spec#*:}:7400"); fi
  done
  for spec in "${specs[@]}"; do
    h=${spec%%:*}
    netbed_wait_ready "$work/$h.ready" || { echo "netbed: dlcpd on $h did not start" >&2; cat "$work/$h.log" >&2; return 1; }
  done
  agg_list=$(IFS=,; echo "${list[*]}")
}

# netbed_stop_aggregators: stops those and waits for them to exit (10 s at most), so that the
# next ones can bind the same ports.
netbed_stop_aggregators() {
  local p _ alive
  kill "${agg_pids[@]}" 2>/dev/null || true
  for _ in $(seq 1 50); do
    alive=0
    for p in "${agg_pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [[ $alive == 0 ]] && break
    sleep 0.2
  done
  agg_pids=()
}

# netbed_workers BUILD OUT "HOST:ADDRESS ..." [dlcp-bench flags...]: one dlcp-bench rank per host,
# in order, against agg_list; waits for all of them. Rank I-1's output is OUT.I.
netbed_workers() {
  local build=$1 out=$2 spec i=0 pids=()
  local -a specs
  read -r -a specs <<< "$3"
  shift 3
  for spec in "${specs[@]}"; do
    i=$((i + 1))
    ip netns exec "$PREFIX-${spec%%:*}" "$build/bench/dlcp_bench/dlcp-bench" --plaintext --aggregators="$agg_list" \
      --workers="${#specs[@]}" --rank=$((i - 1)) --data-host="${spec#*:}" --json "$@" >"$out.$i" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || true; done
}

# netbed_host_workers BUILD OUT PER_HOST "HOST:ADDRESS ..." [dlcp-bench flags...]: PER_HOST
# dlcp-bench ranks on each host, in order, sharing the host stage of the dlcpd netbed_aggregators
# started there (docs/host-stage.md); started in the background, their pids in worker_pids. Rank
# R's output is OUT.R.
netbed_host_workers() {
  local build=$1 out=$2 per=$3 spec j rank=0
  local -a specs
  read -r -a specs <<< "$4"
  shift 4
  worker_pids=()
  for spec in "${specs[@]}"; do
    for ((j = 0; j < per; j++)); do
      ip netns exec "$PREFIX-${spec%%:*}" "$build/bench/dlcp_bench/dlcp-bench" --plaintext --aggregators="$agg_list" \
        --workers=$((${#specs[@]} * per)) --rank=$rank --local-size="$per" --host-socket="$work/${spec%%:*}.sock" \
        --data-host="${spec#*:}" --json "$@" >"$out.$rank" 2>&1 &
      worker_pids+=($!)
      rank=$((rank + 1))
    done
  done
}

# The worker hosts w1..w4 of the single-switch cluster, as netbed_aggregators and netbed_workers
# take them.
netbed_worker_hosts() { local i; for i in 1 2 3 4; do printf 'w%d:%s ' "$i" "$(netbed_ip_of "$i")"; done; }

# netbed_worker_aggregators BUILD: one dlcpd on every worker host w1..w4, as with one aggregator
# per node in production; sets agg_list (host:port,...).
netbed_worker_aggregators() { netbed_aggregators "$1" "$(netbed_worker_hosts)"; }

# netbed_cross_start SECONDS: UDP cross traffic at $CROSS from a1 into every worker's switch port,
# best effort unless CROSS_DSCP gives another code point; netbed_cross_stop ends it.
netbed_cross_start() {
  local i
  for i in 1 2 3 4; do "$CLUSTER" cross a1 "w$i" "$CROSS" "${CROSS_DSCP:-0}" "$1" udp $((5300 + i)) >/dev/null 2>&1 & done
  sleep 1
}
netbed_cross_stop() { pkill -f "iperf3 .*-p 53[0-9][0-9]" 2>/dev/null || true; sleep 1; }
# netbed_cross_received: after netbed_cross_stop, the Mbit/s of cross traffic that reached the
# worker ports, the mean over the 4 (from the receivers' iperf3 reports; 0 for a missing one).
netbed_cross_received() {
  python3 - "$STATE_DIR" "$PREFIX" <<'PY'
import json, sys
total = 0.0
for i in range(1, 5):
    try:
        d = json.load(open(f"{sys.argv[1]}/cross-{sys.argv[2]}-a1-w{i}-{5300 + i}.json.server"))
        total += d["end"]["sum_received"]["bits_per_second"] / 1e6
    except (OSError, ValueError, KeyError):
        pass
print(f"{total / 4:.1f}")
PY
}
