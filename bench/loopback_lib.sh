# Shared by the loopback benchmarks (auth_cost.sh, key_rotation_cost.sh, encoding.sh): local
# dlcpd instances on ephemeral ports, and dlcp-bench jobs against them whose JSON lines are tagged
# and collected in one file. Source it with BUILD set; it sets an EXIT trap that stops every dlcpd
# it started and removes its files.
#   start_dlcpd NAME [DLCPD_FLAG...]      starts one and waits until it is ready: AGG[NAME] is its
#                                         control address, METRICS[NAME] its metrics port (empty
#                                         unless the flags ask for one, e.g. --metrics-port=0),
#                                         PID[NAME] its process;
#                                         on 127.0.0.1 unless the flags give --host (::1: IPv6)
#   run_job NAME TAGS [DLCP_BENCH_FLAG...] one dlcp-bench job against AGG[NAME] (NAME may list
#                                         several, a1,a2): prints its JSON, with TAGS
#                                         ('"k":"v",...') first, and appends it to $BENCH_OUT
#   report TAG <<'PY' ... PY              runs the Python on stdin, which prints the ratio table,
#                                         with `groups` (loopback_groups.by_shape of $BENCH_OUT by
#                                         TAG) and loopback_groups' helpers in scope
BENCH_WORK=$(mktemp -d /tmp/dlcp-bench.XXXXXX)
BENCH_OUT=$BENCH_WORK/out.jsonl
declare -A AGG METRICS PID
_dlcpd_pids=()
_stop_dlcpds() {
  for p in "${_dlcpd_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$BENCH_WORK"
}
trap _stop_dlcpds EXIT

start_dlcpd() {
  local name=$1 ready host=127.0.0.1 f
  shift
  for f in "$@"; do [[ $f == --host=* ]] && host=${f#--host=}; done
  [[ $host == *:* ]] && host="[$host]"
  ready=$BENCH_WORK/$name.ready
  "$BUILD/server/dlcpd" --host=127.0.0.1 --port=0 --data-port=0 --plaintext --log-level=warning "$@" \
    --ready-file="$ready" 2>"$BENCH_WORK/$name.log" &
  _dlcpd_pids+=($!)
  PID[$name]=$!
  for _ in $(seq 1 200); do [ -s "$ready" ] && break; sleep 0.05; done
  if [ ! -s "$ready" ]; then
    echo "dlcpd '$name' ($*) did not become ready in 10 s:" >&2
    cat "$BENCH_WORK/$name.log" >&2
    exit 1
  fi
  AGG[$name]="$host:$(sed -E 's/.*"control_port":([0-9]+).*/\1/' "$ready")"
  METRICS[$name]=$(sed -nE 's/.*"metrics_port":([0-9]+).*/\1/p' "$ready")
}

run_job() {
  local names=$1 tags=$2 j aggs="" n
  shift 2
  for n in ${names//,/ }; do aggs+="${aggs:+,}${AGG[$n]}"; done
  j=$("$BUILD/bench/dlcp_bench/dlcp-bench" --plaintext --aggregators="$aggs" --json "$@" | tail -1)
  echo "{$tags,${j#\{}" | tee -a "$BENCH_OUT"
}

report() {
  PYTHONPATH="$(dirname "${BASH_SOURCE[0]}")" python3 -c '
import sys
from loopback_groups import *
groups = by_shape(sys.argv[1], sys.argv[2])
exec(sys.stdin.read())' "$BENCH_OUT" "$1"
}
