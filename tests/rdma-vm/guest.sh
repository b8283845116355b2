# Runs inside the Soft-RoCE VM (tests/rdma-vm/rxevm.sh) under busybox `sh -e`, with DLCP_BUILD
# set by run.sh: the RDMA transport's unit tests, then real jobs through dlcpd and dlcp-bench
# over verbs. Logs go to /rxevm/out, which comes back to the host; the exit status is the
# number of failed checks.
B=$DLCP_BUILD
OUT=/rxevm/out
failed=0
say() { echo "[guest] $*" | tee -a $OUT/summary.txt; }
pass() { say "PASS $1"; }
fail() { say "FAIL $1: $2"; failed=$((failed + 1)); }

# dlcpd in the background; prints its control port once it is serving (10 s at most).
start_dlcpd() {
  name=$1; shift
  rm -f /tmp/$name.ready
  $B/server/dlcpd --plaintext --port=0 --data-port=0 --ready-file=/tmp/$name.ready "$@" > $OUT/$name.log 2>&1 &
  echo $! > /tmp/$name.pid
  i=0
  while [ ! -s /tmp/$name.ready ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
  sed -n 's/.*"control_port":\([0-9]*\).*/\1/p' /tmp/$name.ready
}
# start_dlcpd runs in a command substitution, so dlcpd is no child of this shell and `wait` would
# return at once: poll until it is gone (10 s at most), so the next step starts without it.
stop_dlcpd() {
  pid=$(cat /tmp/$1.pid)
  kill "$pid" 2>/dev/null || true
  i=0
  while kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
}
field() { sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p" "$2" | tail -1; }

# A gtest binary of the build, with a filter: passes if it ran at least one test and skipped none
# (there is a device here). gtest NAME BINARY FILTER
gtest() {
  if $B/tests/$2 --gtest_filter="$3" --gtest_output=xml:$OUT/$2.xml > $OUT/$2.log 2>&1; then
    if grep -q '\[  SKIPPED \]' $OUT/$2.log; then fail $1 "tests skipped on rxe0";
    elif ! grep -q '\[       OK \]' $OUT/$2.log; then fail $1 "no test ran";
    else pass "$1 ($(grep -c '\[       OK \]' $OUT/$2.log) tests)"; fi
  else
    fail $1 "$(grep -E '^\[  FAILED  \]' $OUT/$2.log | head -5 | tr '\n' ' ')"
  fi
}

# 1. The RDMA transport's own tests; the tests every transport passes (their rdma case); the
#    in-process all-reduce matrix's RDMA cases (exact sums, with and without drops).
gtest unit rdma_test '*'
gtest transport transport_test 'Kinds/TransportTest.*/rdma'
gtest allreduce allreduce_test 'Matrix/AllReduceTest.*/rdma*'

# 2. An exact job: two aggregators with two data threads each (one on --transport=auto, which
#    must choose RDMA here), two workers, ε = 0.
p1=$(start_dlcpd agg1 --transport=rdma --data-threads=2 --host-socket=/tmp/agg1.sock)
p2=$(start_dlcpd agg2 --transport=auto --data-threads=2)
if [ -z "$p1" ] || [ -z "$p2" ]; then
  fail exact "dlcpd did not start: $(tail -3 $OUT/agg1.log $OUT/agg2.log | tr '\n' ' ')"
else
  if ! grep -q 'data RDMA queue pairs' $OUT/agg2.log; then fail auto "--transport=auto did not choose RDMA"; else pass "auto chose RDMA"; fi
  $B/bench/dlcp_bench/dlcp-bench --aggregators=127.0.0.1:$p1,127.0.0.1:$p2 --plaintext --transport=rdma --workers=2 \
    --loss-bound=0 --tensor-bytes=400000 --tensors=2 --rounds=5 --timeout-s=120 > $OUT/exact.txt 2>&1 || true
  if grep -q '"exact":true' $OUT/exact.txt && grep -q 'results exact: yes' $OUT/exact.txt; then
    pass "exact job over RDMA (p50 $(field p50_ms $OUT/exact.txt) ms)"
  else
    fail exact "$(tail -5 $OUT/exact.txt | tr '\n' ' ')"
  fi
  # A worker on the other data plane is refused at join, by name.
  $B/bench/dlcp_bench/dlcp-bench --aggregators=127.0.0.1:$p1 --plaintext --transport=udp --workers=1 --rounds=1 \
    --timeout-s=30 > $OUT/mismatch.txt 2>&1 && rc=0 || rc=$?
  if [ $rc -ne 0 ] && grep -q 'serves data over RDMA but the worker joined with UDP' $OUT/mismatch.txt; then
    pass "a UDP worker is refused by an RDMA aggregator"
  else
    fail mismatch "exit $rc: $(tail -3 $OUT/mismatch.txt | tr '\n' ' ')"
  fi
  # So is an RDMA worker with another Q_Key.
  $B/bench/dlcp_bench/dlcp-bench --aggregators=127.0.0.1:$p1 --plaintext --transport=rdma --rdma-qkey=5 --workers=1 --rounds=1 \
    --timeout-s=30 > $OUT/qkey.txt 2>&1 && rc=0 || rc=$?
  if [ $rc -ne 0 ] && grep -q "RDMA Q_Key 0x5 is not this aggregator's 0xd1c0001" $OUT/qkey.txt; then
    pass "an RDMA worker with another Q_Key is refused"
  else
    fail qkey "exit $rc: $(tail -3 $OUT/qkey.txt | tr '\n' ' ')"
  fi
  # dlcpctl doctor on the real device, first as the VM comes (MTU 1500, small socket buffers: it
  # warns of both), then set up as a node should be: every check ok, agg1 forming its host stage,
  # both aggregators answering over RDMA. The MTU goes back afterwards; the running queue pairs keep
  # the 1024 they began with.
  $B/client/dlcpctl doctor --aggregators= --data-threads=2 > $OUT/doctor-as-booted.txt 2>&1 || true
  if grep -q "^warn  mtu $RXE_NETDEV: interface MTU 1500 gives RoCE an active MTU of 1024" $OUT/doctor-as-booted.txt \
     && grep -q '^warn  net.core.rmem_max' $OUT/doctor-as-booted.txt; then
    pass "doctor warns of the VM's MTU and socket buffers, naming the fixes"
  else
    fail doctor-warns "$(head -6 $OUT/doctor-as-booted.txt | tr '\n' ' ')"
  fi
  ip link set $RXE_NETDEV mtu 9000
  sysctl -w net.core.rmem_max=67108864 net.core.wmem_max=67108864 > /dev/null
  $B/client/dlcpctl doctor --aggregators=127.0.0.1:$p1,127.0.0.1:$p2 --plaintext --transport=rdma \
    --data-threads=2 --host-socket=/tmp/agg1.sock > $OUT/doctor.txt 2>&1 && rc=0 || rc=$?
  ip link set $RXE_NETDEV mtu 1500
  if [ $rc -eq 0 ] && ! grep -qE '^(warn|FAIL)' $OUT/doctor.txt && grep -q '^ok    rdma port rxe0/1 GID' $OUT/doctor.txt \
     && [ "$(grep -c 'data round trip over RDMA' $OUT/doctor.txt)" = 2 ] \
     && grep -q '^ok    host stage /tmp/agg1.sock: dlcpd formed a stage of 2 workers' $OUT/doctor.txt; then
    pass "doctor on rxe0: all $(grep -c '^ok' $OUT/doctor.txt) checks ok, both aggregators reached over RDMA"
  else
    fail doctor "exit $rc: $(grep -v '^ok' $OUT/doctor.txt | head -4 | tr '\n' ' ')"
  fi
fi
stop_dlcpd agg1
stop_dlcpd agg2

# 2b. Data keys rotating every second under a running job (per-worker keys, the default): each
#     worker moves to its new key over heartbeats while its pushes go over verbs; every round is
#     exact and at least one rotation settles.
p=$(start_dlcpd agg5 --transport=rdma --data-key-rotation-s=1)
if [ -z "$p" ]; then
  fail rotation "dlcpd did not start: $(tail -3 $OUT/agg5.log | tr '\n' ' ')"
else
  $B/bench/dlcp_bench/dlcp-bench --aggregators=127.0.0.1:$p --plaintext --transport=rdma --workers=2 --loss-bound=0 \
    --tensor-bytes=100000 --rounds=3 --min-seconds=5 --timeout-s=120 > $OUT/rotation.txt 2>&1 || true
  settled=$(grep -c 'settled, the key before it dropped' $OUT/agg5.log || true)
  if grep -q '"exact":true' $OUT/rotation.txt && [ "$settled" -ge 1 ]; then
    pass "data keys rotate under an RDMA job: $settled rotation(s) settled, $(field rounds $OUT/rotation.txt) rounds exact"
  else
    fail rotation "$settled settled; $(tail -3 $OUT/rotation.txt | tr '\n' ' ')"
  fi
fi
stop_dlcpd agg5

# 3. A bounded-loss job with drops injected at the workers and the aggregator: the bound holds,
#    class 0 arrives, every partial sum is exact over the contributions it reports.
p=$(start_dlcpd agg3 --transport=rdma --inject-drop-class=1:0.1,2:0.1,3:0.2 --inject-seed=3)
if [ -z "$p" ]; then
  fail bounded "dlcpd did not start: $(tail -3 $OUT/agg3.log | tr '\n' ' ')"
else
  $B/bench/dlcp_bench/dlcp-bench --aggregators=127.0.0.1:$p --plaintext --transport=rdma --workers=2 --loss-bound=0.05 \
    --inject-drop-class=1:0.05,2:0.1,3:0.2 --tensor-bytes=400000 --rounds=8 --timeout-s=120 > $OUT/bounded.txt 2>&1 || true
  v=$(field bound_violations $OUT/bounded.txt)
  loss=$(field max_round_loss $OUT/bounded.txt)
  if [ "$v" = 0 ] && grep -q '"checked":true' $OUT/bounded.txt && grep -q '"exact":true' $OUT/bounded.txt; then
    pass "bounded job over RDMA: worst round lost $loss of droppable contributions (ε = 0.05), $(field retransmits $OUT/bounded.txt) chunks repaired"
  else
    fail bounded "$(tail -5 $OUT/bounded.txt | tr '\n' ' ')"
  fi
fi
stop_dlcpd agg3

# 3b. An aggregator and workers with too few receive buffers (--rdma-recv-slots=64, against
#     windows of hundreds of chunks): their queues run dry and the NIC drops what arrives,
#     uncounted. Rounds stay exact (the workers repair), dlcp_transport_rx_queue_empty_total and
#     the clients' count (Client::ReceiveQueueRanDry, client_rx_queue_ran_dry) count it, and the
#     logs name the setting to raise. The port's own counters, exported by dlcpd, count the
#     datagrams lost.
#     A second aggregator beside it doubles the results each worker takes in at once: with one,
#     whether the workers' queues ran dry at all depended on the VM's timing (0 in some runs).
p=$(start_dlcpd agg6 --transport=rdma --rdma-recv-slots=64 --metrics-port=0)
p7=$(start_dlcpd agg7 --transport=rdma --rdma-recv-slots=64)
if [ -z "$p" ] || [ -z "$p7" ]; then
  fail starved "dlcpd did not start: $(tail -3 $OUT/agg6.log | tr '\n' ' ')"
else
  m=$(sed -n 's/.*"metrics_port":\([0-9]*\).*/\1/p' /tmp/agg6.ready)
  timeout 10 wget -qO- "http://127.0.0.1:$m/metrics" > $OUT/agg6.before.metrics || true
  $B/bench/dlcp_bench/dlcp-bench --aggregators=127.0.0.1:$p,127.0.0.1:$p7 --plaintext --transport=rdma --workers=2 --loss-bound=0 \
    --tensor-bytes=4000000 --rounds=8 --timeout-s=120 --rdma-recv-slots=64 > $OUT/starved.txt 2>&1 || true
  timeout 10 wget -qO- "http://127.0.0.1:$m/metrics" > $OUT/agg6.metrics || true
  dry=$(sed -n 's/^dlcp_transport_rx_queue_empty_total \([0-9]*\).*/\1/p' $OUT/agg6.metrics)
  if grep -q "^dlcp_transport_info{device=\"rxe0\",gid_index=\"$RXE_GID_INDEX\",kind=\"rdma\",port=\"1\"} 1" $OUT/agg6.metrics; then
    if $B/client/dlcpctl status --aggregators=127.0.0.1:$p --plaintext | grep -q ' serving  rdma '; then
      pass "dlcp_transport_info names the device, port and GID index, and dlcpctl status the transport"
    else
      fail transport-info "dlcpctl status: $($B/client/dlcpctl status --aggregators=127.0.0.1:$p --plaintext | tr '\n' ' ')"
    fi
  else
    fail transport-info "$(grep dlcp_transport_info $OUT/agg6.metrics)"
  fi
  # The port's own counters (sysfs hw_counters) are exported too. rxe0 carries the workers'
  # datagrams as well as the aggregator's, so it received at least what the aggregator did, and
  # what it received beyond the receives it completed (rdma_recvs) found no buffer: the datagrams
  # the dry queues lost, which no verbs call counts. The port counts since boot: the job's share
  # is what grew while it ran.
  port() { v=$(sed -n "s/^dlcp_rdma_port_counter_total{counter=\"$1\"} \([0-9]*\).*/\1/p" $2); echo "${v:-0}"; }
  rx=$(sed -n 's/^dlcp_transport_packets_total{direction="rx"} \([0-9]*\).*/\1/p' $OUT/agg6.metrics)
  port_rx=$(($(port rcvd_pkts $OUT/agg6.metrics) - $(port rcvd_pkts $OUT/agg6.before.metrics)))
  port_recvs=$(($(port rdma_recvs $OUT/agg6.metrics) - $(port rdma_recvs $OUT/agg6.before.metrics)))
  if [ "${rx:-0}" -ge 1000 ] && [ "${port_rx:-0}" -ge "${rx:-1}" ] && [ $((${port_rx:-0} - ${port_recvs:-0})) -ge 1 ]; then
    pass "port counters exported: rxe0 received $port_rx datagrams (the aggregator $rx), $((port_rx - port_recvs)) with no buffer posted"
  else
    fail port-counters "rxe0 rcvd_pkts grew by $port_rx, rdma_recvs by $port_recvs, the aggregator's datagrams ${rx:-missing}"
  fi
  # The workers read the same port through the client API (Client::PortCounters), and dlcp-bench
  # reports how much its counters grew while they ran: at least the results they received, some
  # of which found no buffer either.
  wport_rx=$(sed -n 's/.*"client_port_counters":{[^}]*"rcvd_pkts":\([0-9]*\).*/\1/p' $OUT/starved.txt | tail -1)
  wport_recvs=$(sed -n 's/.*"client_port_counters":{[^}]*"rdma_recvs":\([0-9]*\).*/\1/p' $OUT/starved.txt | tail -1)
  if [ "${wport_rx:-0}" -ge 1000 ] && [ $((${wport_rx:-0} - ${wport_recvs:-0})) -ge 1 ]; then
    pass "port counters through the client API: rxe0 received $wport_rx datagrams while the workers ran, $((wport_rx - wport_recvs)) with no buffer posted"
  else
    fail client-port-counters "client_port_counters: rcvd_pkts ${wport_rx:-missing}, rdma_recvs ${wport_recvs:-missing}; $(grep -o '"client_port_counters":{[^}]*}' $OUT/starved.txt | tail -1)"
  fi
  wdry=$(field client_rx_queue_ran_dry $OUT/starved.txt)
  if grep -q '"exact":true' $OUT/starved.txt && [ "${dry:-0}" -ge 1 ] && grep -q 'raise --rdma-recv-slots' $OUT/agg6.log \
    && [ "${wdry:-0}" -ge 1 ] && grep -q 'raise --rdma-recv-slots' $OUT/starved.txt; then
    pass "64 receive buffers: rounds exact; the aggregator's queue ran dry $dry time(s), the workers' $wdry, counted and named"
  else
    fail starved "ran dry ${dry:-?} time(s) at the aggregator, ${wdry:-?} at the workers; $(tail -3 $OUT/starved.txt | tr '\n' ' ')"
  fi
fi
stop_dlcpd agg6
stop_dlcpd agg7

# 3c. Host stages over verbs: two "hosts" (a dlcpd each, with its host socket, slots of 256 KiB),
#     two workers on each, so each stage's first worker pushes its host's sum over RDMA. Exact
#     below and above a slot, and under ε = 0.05 with drops injected (the bound held, class 0
#     whole); every worker says its stage formed, with 2 members.
stage_job() {  # NAME FLAGS...: 4 workers, 2 per host; passes where all are exact and staged
  name=$1; shift
  pids=""
  for r in 0 1 2 3; do
    if [ $r -lt 2 ]; then sock=/tmp/hs1.sock; else sock=/tmp/hs2.sock; fi
    $B/bench/dlcp_bench/dlcp-bench --aggregators=127.0.0.1:$h1,127.0.0.1:$h2 --plaintext --transport=rdma --workers=4 \
      --rank=$r --local-size=2 --host-socket=$sock --job=$name --rounds=5 --json --timeout-s=120 "$@" \
      > $OUT/$name.$r.txt 2>&1 &
    pids="$pids $!"
  done
  for pid in $pids; do wait $pid || true; done
  bad=""
  for r in 0 1 2 3; do
    f=$OUT/$name.$r.txt
    grep -q '"exact":true' $f && [ "$(field host_stage_size $f)" = 2 ] && [ "$(field bound_violations $f)" = 0 ] \
      && [ "$(field left_out_c0 $f)" = 0 ] || bad="$bad rank $r: $(tail -2 $f | tr '\n' ' ')"
  done
  if [ -z "$bad" ]; then pass "host stages over RDMA, $name: 4 workers exact, both stages formed"; else fail $name "$bad"; fi
}
h1=$(start_dlcpd hs1 --transport=rdma --host-socket=/tmp/hs1.sock --host-slot-bytes=262144)
h2=$(start_dlcpd hs2 --transport=rdma --host-socket=/tmp/hs2.sock --host-slot-bytes=262144)
if [ -z "$h1" ] || [ -z "$h2" ]; then
  fail stages "dlcpd did not start: $(tail -3 $OUT/hs1.log $OUT/hs2.log | tr '\n' ' ')"
else
  stage_job stage-below-slot --tensor-bytes=100000 --tensors=3
  stage_job stage-above-slot --tensor-bytes=624288
  stage_job stage-bounded --tensor-bytes=624288 --loss-bound=0.05 --inject-drop-class=1:0.05,2:0.05,3:0.05
fi
stop_dlcpd hs1
stop_dlcpd hs2

# 4. A port that is down: --transport=rdma refuses to start and says so; auto falls back to UDP
#    and says why.
ip link set dummy0 down
i=0
while ! grep -q DOWN /sys/class/infiniband/rxe0/ports/1/state && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
$B/server/dlcpd --plaintext --port=0 --data-port=0 --transport=rdma > $OUT/down.log 2>&1 && rc=0 || rc=$?
if [ $rc -ne 0 ] && grep -q 'rxe0 port 1 is not active' $OUT/down.log; then
  pass "port down: dlcpd --transport=rdma refuses to start, naming it"
else
  fail down "exit $rc: $(tail -2 $OUT/down.log | tr '\n' ' ')"
fi
$B/client/dlcpctl doctor --aggregators= > $OUT/doctor-down.txt 2>&1 && rc=0 || rc=$?
if [ $rc -eq 1 ] && grep -q 'FAIL  rdma port rxe0/1: state' $OUT/doctor-down.txt; then
  pass "port down: dlcpctl doctor fails the port, naming the fix"
else
  fail doctor-down "exit $rc: $(head -3 $OUT/doctor-down.txt | tr '\n' ' ')"
fi
p=$(start_dlcpd agg4 --transport=auto)
if [ -n "$p" ] && grep -q 'using UDP, because rxe0 port 1 is not active' $OUT/agg4.log && grep -q 'data UDP ports' $OUT/agg4.log; then
  pass "port down: --transport=auto falls back to UDP, saying why"
else
  fail fallback "$(tail -2 $OUT/agg4.log | tr '\n' ' ')"
fi
stop_dlcpd agg4
say "$failed check(s) failed"
exit $failed
