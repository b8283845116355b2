"""The PyTorch part of scripts/gpu-check.sh: dlcp's DistributedOptimizer and comm hook training on
CUDA tensors, against DDP over Gloo on the same device, in one job of N worker processes that
share the GPU.

    python3 gpu_torch_check.py --aggregators=HOST:PORT,HOST:PORT [--device=cuda] [--workers=4]

For each way, every worker trains the digits CNN for --steps steps from the same start on its own
batches, and reports its parameters and its median step time:
  gloo, dear, hook          float32: DDP over Gloo, DistributedOptimizer, DDP with dlcp's comm hook;
  gloo_accum, dear_accum    two backward passes per step (DDP's no_sync; backward_passes_per_step=2);
  gloo_amp, dear_amp        autocast to float16 with a GradScaler (CUDA only);
  dear_bf16                 a bfloat16 model: its gradients are packed from bfloat16 (CUDA only);
  dear_stage, hook_stage    with --host-sockets: ranks 0 and 1 share the first dlcpd's host stage,
                            ranks 2 and 3 the second's, and their CUDA gradients go through it.
Checks (exit 1 when one fails): dear, hook, dear_accum, dear_amp and the stage ways within
--tolerance (1e-5) relative of their Gloo way; every way's replicas bit-identical; the bfloat16
model trained; with host stages, a float32 and a bfloat16 CUDA tensor summed exactly, pushed by
one worker per stage. Prints one JSON line per worker and way, then the checks and the step times
against DDP over Gloo.
--device=cpu runs the ways that need no GPU, to try the script where there is none.
"""
import argparse
import contextlib
import copy
import json
import os
import socket
import sys
import time

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F

import dlcp
import dlcp.torch
from dlcp.examples import digits

ACCUM_KEYS = (1 << 24) + (1 << 16) * 16
BF16_KEYS = (1 << 24) + (1 << 16) * 32
AMP_KEYS = (1 << 24) + (1 << 16) * 48


def _batches(rank, world, steps, device):
    xtr, ytr, _, _ = digits.load(rank, world)
    g = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        idx = torch.randint(0, len(xtr), (digits.BATCH,), generator=g)
        yield xtr[idx].to(device), ytr[idx].to(device)


def _flat(model):
    return torch.cat([p.detach().float().reshape(-1).cpu() for p in model.parameters()])


def _train(way, model, client, rank, world, args, device):
    """One way's training; returns (parameters, median step time in ms)."""
    accumulate = way.endswith("_accum")
    amp = way.endswith("_amp")
    if way.startswith("gloo") or way.startswith("hook"):
        net = torch.nn.parallel.DistributedDataParallel(model)
        if way.startswith("hook"):
            net.register_comm_hook(None, dlcp.torch.comm_hook(client, model))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        sync_off = net.no_sync
    else:
        net = model
        key = ACCUM_KEYS if accumulate else BF16_KEYS if way == "dear_bf16" else AMP_KEYS if amp else 1 << 24
        tuned = {"fusion_bytes": args.fusion_bytes} if args.fusion_bytes else {}  # else the user's default
        opt = dlcp.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), model,
                                              client, key_base=key, **tuned,
                                              backward_passes_per_step=2 if accumulate else 1, timeout=60)
        sync_off = None
    scaler = torch.cuda.amp.GradScaler(init_scale=2.0 ** 12) if amp else None
    batches = list(_batches(rank, world, args.steps * (2 if accumulate else 1), device))
    times = []
    for step in range(args.steps):
        start = time.perf_counter()
        opt.zero_grad()
        micro = batches[2 * step:2 * step + 2] if accumulate else [batches[step]]
        for i, (x, y) in enumerate(micro):
            # DDP decides in the forward pass whether the backward reduces: both go inside no_sync.
            with sync_off() if (sync_off is not None and i < len(micro) - 1) else contextlib.nullcontext():
                with torch.autocast("cuda", dtype=torch.float16, enabled=amp):
                    loss = F.cross_entropy(net(x.to(next(model.parameters()).dtype)).float(), y) / len(micro)
                (scaler.scale(loss) if amp else loss).backward()
        if amp:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    if isinstance(opt, dlcp.torch.DistributedOptimizer):
        opt.synchronize()
        opt.close()
    times = sorted(times[3:]) or sorted(times)
    return _flat(model), times[len(times) // 2], float(loss.detach())


def _ways(args):
    ways = ["gloo", "dear", "hook", "gloo_accum", "dear_accum"]
    if args.device == "cuda":
        ways += ["gloo_amp", "dear_amp", "dear_bf16"]
    if args.host_sockets:
        ways += ["dear_stage", "hook_stage"]
    return ways


def _stage_client(rank, world, args, port, num_layers):
    """A client of a job whose ranks share host stages two by two (--host-sockets)."""
    sockets = args.host_sockets.split(",")
    return dlcp.Client(aggregators=args.aggregators, job=f"gpu-check-stage-{port}", world_size=world, rank=rank,
                       plaintext=True, loss_bound=0, num_layers=num_layers, local_size=2,
                       host_socket=sockets[rank // 2])


_STAGE_DTYPES = {"cuda": (torch.float32, torch.bfloat16), "cpu": (torch.float32,)}


def _check_stage_sums(client, rank, world, device):
    """Device tensors through the host stage: exact sums, and only each stage's first worker pushes.
    Returns what went wrong, or None."""
    for i, dtype in enumerate(_STAGE_DTYPES[device.type]):
        n = 5_000_001  # over 16 MiB of float32: more than one slot, so several steps
        t = ((torch.arange(n, device=device) * 7 + rank * 5) % 31 - 15).to(dtype)
        want = sum(((torch.arange(n, device=device) * 7 + r * 5) % 31 - 15) for r in range(world)).to(dtype)
        stats = client.allreduce(9000 + i, t, timeout=60)
        if not torch.equal(t, want):
            return f"rank {rank}: a {dtype} device tensor through the host stage is not the exact sum"
        if (stats["bytes_sent"] > 0) != (rank % 2 == 0):
            return f"rank {rank}: sent {stats['bytes_sent']} bytes for a {dtype} tensor; only a stage's first pushes"
    return None


def _time_allreduce(staged, client, device, reps=5):
    """Median ms of an all-reduce of 64 MiB of float32 through the host stages and through the
    network path (every worker pushing its own), side by side."""
    t = torch.ones(16 << 20, device=device)
    times = {}
    for name, c, key in (("stage_ms", staged, 9100), ("network_ms", client, 9101)):
        runs = []
        for _ in range(reps + 1):
            start = time.perf_counter()
            c.allreduce(key, t, timeout=60)
            runs.append((time.perf_counter() - start) * 1e3)
        times[name] = sorted(runs[1:])[reps // 2]
    return times


def worker(rank, world, args, port, out_queue):
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    base = digits.Net(hidden=args.hidden).to(device)
    layers = dlcp.torch.num_layers(base)
    client = dlcp.Client(aggregators=args.aggregators, job=f"gpu-check-{port}", world_size=world, rank=rank,
                         plaintext=True, loss_bound=0, num_layers=layers)
    staged = _stage_client(rank, world, args, port, layers) if args.host_sockets else None
    try:
        if staged is not None:
            out_queue.put({"rank": rank, "way": "stage_sums", "error": _check_stage_sums(staged, rank, world, device),
                           "what": " and ".join(f"{t} {device.type}" for t in _STAGE_DTYPES[device.type]),
                           **_time_allreduce(staged, client, device)})
        for way in _ways(args):
            model = copy.deepcopy(base)
            if way == "dear_bf16":
                model = model.to(torch.bfloat16)
            params, step_ms, loss = _train(way, model, staged if way.endswith("_stage") else client, rank, world,
                                           args, device)
            out_queue.put({"rank": rank, "way": way, "step_ms": step_ms, "loss": loss, "params": params.tolist()})
    finally:
        client.close()
        if staged is not None:
            staged.close()
        torch.distributed.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _relative(a, b):
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))


def check(results, world, tolerance):
    """The checks over every worker's results; returns the failures."""
    failures = [r["error"] for r in results if r.get("error")]
    sums = [r for r in results if r["way"] == "stage_sums"]
    if sums and not failures:
        print(f"gpu-check: host stages: {sums[0]['what']} tensors summed exactly, one push per stage")
        print(f"gpu-check: 64 MiB of float32, median of 5, worst worker: through host stages "
              f"{max(r['stage_ms'] for r in sums):.1f} ms, every worker pushing its own "
              f"{max(r['network_ms'] for r in sums):.1f} ms")
    results = [r for r in results if "params" in r]
    by = {(r["way"], r["rank"]): torch.tensor(r["params"]) for r in results}
    ways = sorted({r["way"] for r in results})
    for way in ways:
        for rank in range(1, world):
            if not torch.equal(by[(way, rank)], by[(way, 0)]):
                failures.append(f"{way}: rank {rank}'s parameters differ from rank 0's")
    for way, reference in (("dear", "gloo"), ("hook", "gloo"), ("dear_accum", "gloo_accum"), ("dear_amp", "gloo_amp"),
                           ("dear_stage", "gloo"), ("hook_stage", "gloo")):
        if way in ways:
            err = max(_relative(by[(way, r)], by[(reference, r)]) for r in range(world))
            print(f"gpu-check: {way} against {reference}: {err:.3g} relative")
            if err > tolerance:
                failures.append(f"{way}: {err:.3g} from {reference}, more than {tolerance}")
    if "dear_bf16" in ways:
        bf16 = [r for r in results if r["way"] == "dear_bf16"][0]
        moved = _relative(by[("dear_bf16", 0)], by[("gloo", 0)])
        print(f"gpu-check: dear_bf16 final loss {bf16['loss']:.3f}, {moved:.3g} from float32 Gloo")
        if not moved < 0.1:
            failures.append(f"dear_bf16: {moved:.3g} from float32 Gloo's parameters")
    return failures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aggregators", required=True)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--fusion-bytes", type=int, default=0, help="0: DistributedOptimizer's default")
    parser.add_argument("--tolerance", type=float, default=1e-5)
    parser.add_argument("--host-sockets", default="",
                        help="two dlcpd host sockets: adds the ways through host stages of two workers each")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu-check: torch sees no CUDA device")
        return 1
    print(f"gpu-check: torch {torch.__version__}, dlcp {dlcp.__version__}, packer: "
          f"{dlcp.cuda_status() or 'CUDA'}, {args.workers} workers on {args.device}", flush=True)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=worker, args=(r, args.workers, args, port, queue)) for r in range(args.workers)]
    for p in procs:
        p.start()
    results = []
    if args.host_sockets and (args.workers != 4 or len(args.host_sockets.split(",")) != 2):
        parser.error("--host-sockets needs two sockets and 4 workers")
    ways = len(_ways(args)) + (1 if args.host_sockets else 0)
    deadline = time.monotonic() + 420
    while len(results) < args.workers * ways and time.monotonic() < deadline:
        try:
            results.append(queue.get(timeout=5))
        except Exception:
            if any(p.exitcode not in (None, 0) for p in procs):
                break
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    if len(results) < args.workers * ways:
        print(f"gpu-check: {len(results)} of {args.workers * ways} results; exit codes {[p.exitcode for p in procs]}")
        return 1
    for r in results:
        print(json.dumps({k: v for k, v in r.items() if k != "params"}))
    failures = check(results, args.workers, args.tolerance)
    step = {w: sorted(r["step_ms"] for r in results if r["way"] == w) for w in {r["way"] for r in results if "step_ms" in r}}
    print("| way | median step ms (worst worker) | / DDP over Gloo |\n|---|---|---|")
    for way in sorted(step):
        ref = "gloo_accum" if way.endswith("_accum") else "gloo_amp" if way.endswith("_amp") else "gloo"
        print(f"| {way} | {step[way][-1]:.2f} | {step[way][-1] / step[ref][-1]:.2f} |")
    for f in failures:
        print("gpu-check: FAILED", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
