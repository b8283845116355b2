#!/usr/bin/env bash
# Workers on one host, as a user gets them: one dlcpd on the host and dlcp-bench's ranks with their
# defaults, which sum in the dlcpd's host stage (docs/host-stage.md), against Gloo over TCP on
# loopback, ring and halving-doubling, in one run: 2 to 64 workers, 4 MiB and 100 MiB, p50 and
# p99, and the CPU seconds all of each job's processes spent per GiB reduced (workers and dlcpd).
# Beside them, up to PER_WORKER_MAX workers (16), dlcp with host_stage=false: every worker pushing
# its own, over the same dlcpd. Prints one JSON line per measurement, then a ratio table (below 1:
# dlcp is faster). A shape whose Gloo run would not fit in memory is left out, and named.
#   [WORKERS_LIST="2 4"] [SIZES=BYTES...] bench/host_stage.sh [BUILD_DIR]
set -euo pipefail
BUILD=${1:-build}
WORKERS_LIST=${WORKERS_LIST:-"2 4 8 16 32 64"}
PER_WORKER_MAX=${PER_WORKER_MAX:-16}
SIZES=${SIZES:-"4194304 104857600"}
source "$(dirname "$0")/loopback_lib.sh"

# The host's dlcpd, its host socket in the work directory rather than the system's /run/dlcp.
start_dlcpd host --host-socket="$BENCH_WORK/dlcpd.sock"

python3 - "$BUILD" "${AGG[host]}" "${PID[host]}" "$BENCH_WORK/dlcpd.sock" "$WORKERS_LIST" "$SIZES" "$PER_WORKER_MAX" <<'PY'
import json, os, resource, subprocess, sys
build, agg, dlcpd, sock, workers_list, sizes, per_worker_max = sys.argv[1:]
per_worker_max = int(per_worker_max)
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
    cpu = children_cpu() - c0 + (dlcpd_cpu() - d0 if system.startswith("dlcp") else 0)
    row = json.loads(out)
    row["system"] = system
    row["cpu_s_per_gib"] = cpu / (tensor_bytes * (rounds + 2) / 2**30)  # 2 warm-up rounds each
    print(json.dumps(row), flush=True)
    return row

def mem_available():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0

rows, skipped = [], []
for n in map(int, workers_list.split()):
    for b in map(int, sizes.split()):
        # Gloo's halving-doubling keeps about three tensors per rank; a job that would not fit in
        # memory is left out and named, not run into the kernel's OOM killer.
        if 3 * n * b > 0.8 * mem_available():
            skipped.append(f"{n} workers x {b / 2**20:.0f} MiB: {3 * n * b / 2**30:.1f} GiB for Gloo, over 80% of free memory")
            continue
        r = 10 if b >= 50_000_000 else (100 if n <= 16 else 20)
        for algorithm, system in (("ring", "gloo_ring_tcp"), ("halving_doubling", "gloo_hd_tcp")):
            rows.append(run(system, [f"{build}/bench/gloo_allreduce", "--workers", str(n), "--tensor-bytes", str(b),
                                     "--rounds", str(r), "--algorithm", algorithm], b, r))
        bench = [f"{build}/bench/dlcp_bench/dlcp-bench", "--plaintext", f"--aggregators={agg}", f"--workers={n}",
                 f"--tensor-bytes={b}", f"--rounds={r}", "--warmup=2", f"--host-socket={sock}", "--json"]
        rows.append(run("dlcp_host_stage", bench, b, r))
        if n <= per_worker_max:
            rows.append(run("dlcp_per_worker", bench + ["--host-stage=false"], b, r))

by = {}
for row in rows:
    by.setdefault((row["workers"], row["tensor_bytes"]), {})[row["system"]] = row
print()
print("| workers | size | gloo ring / hd p50 ms | host stage p50 / p99 ms | p50 / better gloo | per-worker p50 ms |"
      " CPU s/GiB ring / hd / host stage | stage formed | exact |")
print("|---|---|---|---|---|---|---|---|---|")
for (n, b), s in sorted(by.items()):
    g, d, h, w = s["gloo_ring_tcp"], s["gloo_hd_tcp"], s["dlcp_host_stage"], s.get("dlcp_per_worker")
    best = min(g["p50_ms"], d["p50_ms"])
    per_worker = f"{w['p50_ms']:.2f}" if w else "not run"
    exact = h.get("exact") and (w is None or w.get("exact")) and g.get("exact") and d.get("exact")
    print(f"| {n} | {b / 2**20:.0f} MiB | {g['p50_ms']:.2f} / {d['p50_ms']:.2f} | {h['p50_ms']:.2f} / {h['p99_ms']:.2f} "
          f"| {h['p50_ms'] / best:.2f} | {per_worker} "
          f"| {g['cpu_s_per_gib']:.2f} / {d['cpu_s_per_gib']:.2f} / {h['cpu_s_per_gib']:.2f} "
          f"| {h.get('staged_workers', 0)} of {n} | {'yes' if exact else 'NO'} |")
for line in skipped:
    print(f"left out: {line}")
PY
