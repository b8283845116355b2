# Sourced by the test bed's users (tests/netbed/, bench/netbed_*.sh): a work directory and the
# emulated cluster, both removed on exit together with every background job they started.
# Needs CLUSTER (the path of cluster.sh, or of multipath.sh for the two-rack bed) and PREFIX
# (namespace names, distinct per user).

# The cluster they all use: 4 worker hosts and 1 more host behind a strict-priority switch,
# 1 Gbit/s ports with 64-packet queues unless the environment says otherwise.
export NWORKERS=4 NAGGS=1 RATE=${RATE:-1gbit} QLEN_PKTS=${QLEN_PKTS:-64}

netbed_cleanup() {
  jobs -p | xargs -r kill 2>/dev/null || true
  wait 2>/dev/null || true
  "$CLUSTER" down >/dev/null 2>&1 || true
  rm -rf "$work"
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

# The address of worker host wN in the emulated cluster.
netbed_ip_of() { echo "198.18.0.$((10 + $1))"; }

# netbed_worker_aggregators BUILD: one dlcpd on every worker host w1..w4, as with one aggregator
# per node in production; sets agg_list (host:port,...).
netbed_worker_aggregators() {
  local i aggs=()
  for i in 1 2 3 4; do
    ip netns exec "$PREFIX-w$i" "$1/server/dlcpd" --host="$(netbed_ip_of $i)" --port=7400 --data-port=7500 \
      --plaintext --log-level=warning --ready-file="$work/a$i.ready" 2>"$work/a$i.log" &
    aggs+=("$(netbed_ip_of $i):7400")
  done
  for i in 1 2 3 4; do
    netbed_wait_ready "$work/a$i.ready" || { echo "netbed: dlcpd on w$i did not start" >&2; return 1; }
  done
  agg_list=$(IFS=,; echo "${aggs[*]}")
}

# netbed_cross_start SECONDS: best-effort UDP cross traffic at $CROSS from a1 into every worker's
# switch port; netbed_cross_stop ends it.
netbed_cross_start() {
  local i
  for i in 1 2 3 4; do "$CLUSTER" cross a1 "w$i" "$CROSS" 0 "$1" udp $((5300 + i)) >/dev/null 2>&1 & done
  sleep 1
}
netbed_cross_stop() { pkill -f "iperf3 .*-p 53[0-9][0-9]" 2>/dev/null || true; sleep 1; }
