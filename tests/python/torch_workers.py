"""Worker bodies for test_torch.py, run in spawned processes (one per rank)."""
import copy
import os
import time

import torch
import torch.nn.functional as F

import dlcp
import dlcp.torch
from dlcp.examples import digits

STEPS = 20


def _flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def _batches(rank, world):
    xtr, ytr, _, _ = digits.load(rank, world)
    g = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        idx = torch.randint(0, len(xtr), (digits.BATCH,), generator=g)
        yield xtr[idx], ytr[idx]


def parity(rank, world, aggregators, gloo_init, optimizer, job):
    """Trains the same model three ways for STEPS steps on this rank's batches: DDP with Gloo,
    DDP with dlcp's comm hook, and dlcp's DistributedOptimizer. Returns the three parameter vectors."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=gloo_init, rank=rank, world_size=world)
    base = digits.Net()
    client = dlcp.Client(aggregators=aggregators, job=job, world_size=world, rank=rank, plaintext=True,
                         loss_bound=0, num_layers=dlcp.torch.num_layers(base))
    out = {}
    try:
        for way in ("gloo", "hook", "dear"):
            model = copy.deepcopy(base)
            if way == "dear":
                net = model
                opt = dlcp.torch.DistributedOptimizer(digits.make_optimizer(optimizer, model.parameters(), 0.05
                                                                            if optimizer == "sgd" else 2e-3),
                                                      model, client, fusion_bytes=64 << 10, timeout=60)
            else:
                net = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.05)
                if way == "hook":
                    net.register_comm_hook(None, dlcp.torch.comm_hook(client, model))
                opt = digits.make_optimizer(optimizer, net.parameters(), 0.05 if optimizer == "sgd" else 2e-3)
            for x, y in _batches(rank, world):
                opt.zero_grad()
                F.cross_entropy(net(x), y).backward()
                opt.step()
            if way == "dear":
                opt.synchronize()
                out["groups"] = len(opt._groups)
            out[way] = _flat(model)
    finally:
        client.close()
        torch.distributed.destroy_process_group()
    return out


def accuracy(rank, world, aggregators, loss_bound, inject_drop, epochs):
    totals = {}
    history = digits.train("dlcp", rank, world, aggregators, epochs, optimizer="adam", loss_bound=loss_bound,
                           inject_drop=inject_drop, totals=totals,
                           client_options={"plaintext": True, "job": f"acc-{loss_bound}-{inject_drop}"})
    return {"accuracy": history[-1][1], **totals}


def dies_mid_training(rank, world, aggregators, die_rank, die_step, how):
    """Rank `die_rank` stops at `die_step`: how="crash" vanishes without leaving; how="raise"
    raises in its training loop, and its `finally` closes the client as well-kept code does. The
    others report what they see."""
    torch.manual_seed(0)
    model = digits.Net()
    client = dlcp.Client(aggregators=aggregators, job=f"dies-{how}", world_size=world, rank=rank, plaintext=True,
                         loss_bound=0, heartbeat_interval_ms=500)
    opt = dlcp.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model, client, timeout=60)
    start = None
    try:
        for step, (x, y) in enumerate(_batches(rank, world)):
            if rank == die_rank and step == die_step:
                if how == "crash":
                    os._exit(3)  # no close, no goodbye
                raise RuntimeError("a bug in the trainer")
            if step == die_step:
                start = time.monotonic()
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        opt.synchronize()
    except RuntimeError as e:  # dlcp.Error is one too
        return {"error": str(e), "after_s": time.monotonic() - (start or time.monotonic())}
    finally:
        client.close()
    return {"error": None}


def auto_fusion(rank, world, aggregators):
    """A short online tuning run: every worker must end on the same size and the same parameters."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = digits.Net()
    client = dlcp.Client(aggregators=aggregators, job="auto-fusion", world_size=world, rank=rank, plaintext=True,
                         loss_bound=0)
    sizes = []
    try:
        opt = dlcp.torch.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-3), model, client,
                                              fusion_bytes="auto", tune_trials=4, tune_warmup=1, tune_steps=1,
                                              timeout=60)
        for x, y in _batches(rank, world):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            sizes.append(opt.fusion_bytes)
        opt.synchronize()
    finally:
        client.close()
    return {"sizes": sizes, "params": _flat(model)}


def bounded_pull(rank, world, aggregators, inject_drop):
    """Bounded pull with injected loss on results' way in, broadcast every 5 steps."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = digits.Net()
    client = dlcp.Client(aggregators=aggregators, job="bounded-pull", world_size=world, rank=rank, plaintext=True,
                         loss_bound=0.05, pull_mode="bounded", inject_drop_class=inject_drop, inject_seed=rank + 1)
    try:
        opt = dlcp.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), model,
                                              client, broadcast_every=5, timeout=60)
        for x, y in _batches(rank, world):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        opt.synchronize()
    finally:
        client.close()
    return _flat(model)
