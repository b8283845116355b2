#!/usr/bin/env bash
# Workers on one host, as a user gets them: one dlcpd on the host and dlcp-bench's ranks with their
# defaults, which sum in the dlcpd's host stage (docs/host-stage.md), against Gloo's ring over TCP
# on loopback, in one run: 2 and 4 workers, 4 MiB and 100 MiB, p50 and p99, and the CPU seconds all
# of each job's processes spent per GiB reduced (workers and dlcpd). Beside them, dlcp with
# host_stage=false: every worker pushing its own, over the same dlcpd. Prints one JSON line per
# measurement, then a ratio table (below 1: dlcp is faster, or spends less).
#   bench/host_stage.sh [BUILD_DIR]
set -euo pipefail
BUILD=${1:-build}
WORKERS_LIST=${WORKERS_LIST:-"2 4"}
SIZES=${SIZES:-"4194304 104857600"}
source "$(dirname "$0")/loopback_lib.sh"

# The host's dlcpd, its host socket in the work directory rather than the system's /run/dlcp.
start_dlcpd host --host-socket="$BENCH_WORK/dlcpd.sock"

python3 - "$BUILD" "${AGG[host]}" "${PID[host]}" "$BENCH_WORK/dlcpd.sock" "$WORKERS_LIST" "$SIZES" <<'PY'
import json, os, resource, subprocess, sys
build, agg, dlcpd, sock, workers_list, sizes = sys.argv[1:]
tick = os.sysconf("SC_CLK_TCK")

def dlcpd_cpu():
    f = open(f"/proc/{dlcpd}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / tick

def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime

def run(system, argv, tensor_bytes, rounds):
    c0, d0 = children_cpu(), dlcpd_cpu()
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    cpu = children_cpu() - c0 + (dlcpd_cpu() - d0 if system != "gloo_ring_tcp" else 0)
    row = json.loads(out)
    row["system"] = system
    row["cpu_s_per_gib"] = cpu / (tensor_bytes * (rounds + 2) / 2**30)  # 2 warm-up rounds each
    print(json.dumps(row), flush=True)
    return row

rows = []
for n in map(int, workers_list.split()):
    for b in map(int, sizes.split()):
        r = 10 if b >= 50_000_000 else 100
        rows.append(run("gloo_ring_tcp", [f"{build}/bench/gloo_allreduce", "--workers", str(n), "--tensor-bytes", str(b),
                                          "--rounds", str(r)], b, r))
        bench = [f"{build}/client/dlcp-bench", "--plaintext", f"--aggregators={agg}", f"--workers={n}",
                 f"--tensor-bytes={b}", f"--rounds={r}", "--warmup=2", f"--host-socket={sock}", "--json"]
        rows.append(run("dlcp_host_stage", bench, b, r))
        rows.append(run("dlcp_per_worker", bench + ["--host-stage=false"], b, r))

by = {}
for row in rows:
    by.setdefault((row["workers"], row["tensor_bytes"]), {})[row["system"]] = row
print()
print("| workers | size | gloo p50 / p99 ms | host stage p50 / p99 ms | ratio p50 / p99 | per-worker p50 ms (ratio) |"
      " CPU s/GiB gloo / host stage / per-worker | exact |")
print("|---|---|---|---|---|---|---|---|")
for (n, b), s in sorted(by.items()):
    g, h, w = s["gloo_ring_tcp"], s["dlcp_host_stage"], s["dlcp_per_worker"]
    print(f"| {n} | {b / 2**20:.0f} MiB | {g['p50_ms']:.2f} / {g['p99_ms']:.2f} | {h['p50_ms']:.2f} / {h['p99_ms']:.2f} "
          f"| {h['p50_ms'] / g['p50_ms']:.2f} / {h['p99_ms'] / g['p99_ms']:.2f} "
          f"| {w['p50_ms']:.2f} ({w['p50_ms'] / g['p50_ms']:.2f}) "
          f"| {g['cpu_s_per_gib']:.2f} / {h['cpu_s_per_gib']:.2f} / {w['cpu_s_per_gib']:.2f} "
          f"| {'yes' if h.get('exact') and w.get('exact') else 'NO'} |")
PY
