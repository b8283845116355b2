# Sourced by the test bed's users (tests/netbed/, bench/netbed_compare.sh): a work directory and
# the emulated cluster, both removed on exit together with every background job they started.
# Needs CLUSTER (the path of cluster.sh) and the cluster's settings in the environment.

netbed_cleanup() {
  jobs -p | xargs -r kill 2>/dev/null || true
  wait 2>/dev/null || true
  "$CLUSTER" down >/dev/null 2>&1 || true
  rm -rf "$work"
}

# netbed_start NAME: sets $work, brings the cluster up, and cleans both up on exit.
netbed_start() {
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
