"""Worker bodies for test_torch.py, run in spawned processes (one per rank)."""
import contextlib
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


def _beside_gloo(rank, world, aggregators, gloo_init, job, make_model, host_sockets=None):
    """A worker of a job that trains both over Gloo and through dlcp: the Gloo process group, the
    model every way starts from (the same on every rank), and an exact dlcp client. With
    `host_sockets`, ranks share host stages two by two, each pair through its own dlcpd's socket."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=gloo_init, rank=rank, world_size=world)
    base = make_model()
    stage = {"local_size": 2, "host_socket": host_sockets[rank // 2]} if host_sockets else {}
    client = dlcp.Client(aggregators=aggregators, job=job, world_size=world, rank=rank, plaintext=True,
                         loss_bound=0, num_layers=dlcp.torch.num_layers(base), **stage)
    return base, client


def _parity_optimizer(name, params):
    """The optimizers of the parity runs. Adam's eps is 1e-3, not its default 1e-8: with the default
    a gradient that sums to almost zero becomes an update of about ±lr whose sign its last bits
    decide, and the aggregators add the workers' gradients in the order they arrive where Gloo adds
    them around its ring. With eps above those last bits, Adam is no more sensitive to the order of
    a sum than SGD with momentum, and the comparison is about dlcp rather than rounding."""
    if name == "adam":
        return torch.optim.Adam(params, lr=2e-3, eps=1e-3)
    return digits.make_optimizer(name, params, 0.05)


def parity(rank, world, aggregators, gloo_init, optimizer, job, host_sockets=None):
    """Trains the same model three ways for STEPS steps on this rank's batches: DDP with Gloo,
    DDP with dlcp's comm hook, and dlcp's DistributedOptimizer. Returns the three parameter vectors."""
    base, client = _beside_gloo(rank, world, aggregators, gloo_init, job, digits.Net, host_sockets)
    out = {}
    try:
        for way in ("gloo", "hook", "dear"):
            model = copy.deepcopy(base)
            if way == "dear":
                net = model
                opt = dlcp.torch.DistributedOptimizer(_parity_optimizer(optimizer, model.parameters()), model, client,
                                                      fusion_bytes=64 << 10, timeout=60)
            else:
                net = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.05)
                if way == "hook":
                    net.register_comm_hook(None, dlcp.torch.comm_hook(client, model))
                opt = _parity_optimizer(optimizer, net.parameters())
            for x, y in _batches(rank, world):
                opt.zero_grad()
                F.cross_entropy(net(x), y).backward()
                opt.step()
            if way == "dear":
                opt.synchronize()
                out["groups"] = len(opt._groups)
            out[way] = _flat(model)
        out["host_stage"] = client.host_stage._asdict()
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


class _Extended(torch.nn.Module):
    """digits.Net with what real models have: a frozen layer (conv1), a head the forward pass never
    uses, and a batch norm with a float64 and an integer buffer."""

    def __init__(self):
        super().__init__()
        self.net = digits.Net()
        self.unused = torch.nn.Linear(8, 8)
        self.norm = torch.nn.BatchNorm1d(10).double().requires_grad_(False)
        self.net.conv1.weight.requires_grad_(False)

    def forward(self, x):
        return self.net(x)


def _grouped_sgd(model):
    """Two parameter groups with their own learning rates; frozen parameters in neither."""
    fc = [p for n, p in model.named_parameters() if "fc" in n]
    rest = [p for n, p in model.named_parameters() if "fc" not in n and p.requires_grad and "norm" not in n]
    return torch.optim.SGD([{"params": fc, "lr": 0.05}, {"params": rest, "lr": 0.02}], momentum=0.9)


def accumulation(rank, world, aggregators, gloo_init, job):
    """Two backward passes per step (the loss halved), with parameter groups, a frozen and an unused
    parameter: DDP over Gloo (no_sync on the first pass) against DistributedOptimizer with
    backward_passes_per_step=2, and against it with no_sync() and zero_grad(set_to_none=False)."""
    base, client = _beside_gloo(rank, world, aggregators, gloo_init, job, _Extended)
    out = {}
    try:
        for way in ("gloo", "passes", "no_sync"):
            model = copy.deepcopy(base)
            if way == "gloo":
                net = torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
                opt = _grouped_sgd(model)
            else:
                net = model
                opt = dlcp.torch.DistributedOptimizer(_grouped_sgd(model), model, client, fusion_bytes=16 << 10,
                                                      backward_passes_per_step=2 if way == "passes" else 1,
                                                      key_base=(1 << 24) + (1 << 16) * (8 if way == "passes" else 16),
                                                      timeout=60)
            batches = list(_batches(rank, world))
            for first, second in zip(batches[0::2], batches[1::2]):
                opt.zero_grad(set_to_none=way != "no_sync")
                skip = net.no_sync() if way == "gloo" else opt.no_sync() if way == "no_sync" else contextlib.nullcontext()
                with skip:
                    (F.cross_entropy(net(first[0]), first[1]) * 0.5).backward()
                (F.cross_entropy(net(second[0]), second[1]) * 0.5).backward()
                opt.step()
            if way != "gloo":
                opt.synchronize()
                out["rounds_" + way] = opt.totals["rounds"]
            out[way] = _flat(model)
            out["frozen_" + way] = model.net.conv1.weight.detach().numpy().copy()
            out["unused_" + way] = model.unused.weight.detach().numpy().copy()
    finally:
        client.close()
        torch.distributed.destroy_process_group()
    out["frozen_start"] = base.net.conv1.weight.detach().numpy().copy()
    out["unused_start"] = base.unused.weight.detach().numpy().copy()
    return out


def _cpu_grad_scaler(init_scale):
    """A GradScaler that runs on CPU tensors: torch's own where it has one (torch.amp, 2.3 on);
    on older torch, torch.cuda.amp.GradScaler with its three CUDA kernels done in plain torch, so
    its step() and unscale_() bookkeeping, which DistributedOptimizer relies on, is torch's."""
    amp = getattr(torch, "amp", None)
    if amp is not None and hasattr(amp, "GradScaler"):
        return amp.GradScaler("cpu", init_scale=init_scale, growth_interval=3)
    from torch.cuda.amp.grad_scaler import _refresh_per_optimizer_state
    import collections
    import warnings

    class CpuGradScaler(torch.cuda.amp.GradScaler):
        def __init__(self):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "CUDA is not available. Disabling."
                super().__init__(init_scale=init_scale, growth_interval=3)
            # What the constructor sets when it stays enabled.
            self._enabled, self._init_scale, self._scale, self._growth_tracker = True, init_scale, None, None
            self._growth_factor, self._backoff_factor, self._growth_interval, self._init_growth_tracker = 2.0, 0.5, 3, 0
            self._per_optimizer_states = collections.defaultdict(_refresh_per_optimizer_state)

        def scale(self, outputs):
            if self._scale is None:
                self._lazy_init_scale_growth_tracker(outputs.device)
            return outputs * self._scale

        def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16):
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        found_inf += (~torch.isfinite(p.grad)).any().float()
                        p.grad.mul_(inv_scale)
            return {found_inf.device: found_inf.clamp_(max=1)}

        def update(self, new_scale=None):
            found = sum(v.item() for s in self._per_optimizer_states.values()
                        for v in s["found_inf_per_device"].values())
            if found:
                self._scale.mul_(self._backoff_factor)
                self._growth_tracker.zero_()
            else:
                self._growth_tracker += 1
                if self._growth_tracker.item() == self._growth_interval:
                    self._scale.mul_(self._growth_factor)
                    self._growth_tracker.zero_()
            self._per_optimizer_states = collections.defaultdict(_refresh_per_optimizer_state)

    return CpuGradScaler()


def amp_steps(rank, world, aggregators, gloo_init, job, inf_rank, inf_step):
    """GradScaler with DDP over Gloo and with DistributedOptimizer; rank `inf_rank` overflows at
    step `inf_step`. Returns each way's parameters, scales and skipped steps."""
    base, client = _beside_gloo(rank, world, aggregators, gloo_init, job, digits.Net)
    out = {}
    try:
        for way in ("gloo", "dear"):
            model = copy.deepcopy(base)
            scaler = _cpu_grad_scaler(init_scale=2.0 ** 10)
            if way == "gloo":
                net, opt = torch.nn.parallel.DistributedDataParallel(model), torch.optim.SGD(model.parameters(), lr=0.05)
            else:
                net = model
                opt = dlcp.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model, client,
                                                      fusion_bytes=64 << 10, timeout=60)
            scales, skipped = [], 0
            for step, (x, y) in enumerate(_batches(rank, world)):
                opt.zero_grad()
                loss = F.cross_entropy(net(x), y)
                if rank == inf_rank and step == inf_step:
                    loss = loss * float("inf")
                before = _flat(model)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                scales.append(scaler.get_scale())
                if way == "gloo":
                    skipped += int((before == _flat(model)).all())
            if way == "dear":
                opt.synchronize()
                skipped = opt.totals["skipped_steps"]
            out[way] = {"params": _flat(model), "scales": scales, "skipped": skipped}
    finally:
        client.close()
        torch.distributed.destroy_process_group()
    return out


def broadcasts(rank, world, aggregators, job):
    """Replicas that start apart: broadcast_parameters makes them root's (float64 and integer
    buffers included), broadcast_optimizer_state gives every worker root's Adam state, and a
    DistributedOptimizer's state_dict is the same everywhere after training and loads back."""
    torch.manual_seed(100 + rank)
    torch.set_num_threads(1)
    model = _Extended()
    model.norm.num_batches_tracked.fill_(7 + rank)
    model.norm.running_var.add_(1e-9 * (rank + 1))  # apart below float32's precision
    client = dlcp.Client(aggregators=aggregators, job=job, world_size=world, rank=rank, plaintext=True, loss_bound=0)
    root = 1
    try:
        dlcp.torch.broadcast_parameters(model, root=root)  # the one open client
        plain = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        if rank == root:  # root resumed from a checkpoint: its Adam has taken steps
            for x, y in list(_batches(rank, world))[:3]:
                plain.zero_grad()
                F.cross_entropy(model(x), y).backward()
                plain.step()
        dlcp.torch.broadcast_parameters(model, root=root)
        dlcp.torch.broadcast_optimizer_state(plain, root=root)
        adam = copy.deepcopy(plain.state_dict()["state"])  # before training moves it on
        opt = dlcp.torch.DistributedOptimizer(plain, model, fusion_bytes=16 << 10, timeout=60)
        for x, y in _batches(rank, world):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        state = opt.state_dict()
        opt.load_state_dict(state)
        return {"params": _flat(model), "running_var": model.norm.running_var.numpy().copy(),
                "tracked": int(model.norm.num_batches_tracked), "adam_steps": [float(s["step"]) for s in adam.values()],
                "exp_avg": torch.cat([s["exp_avg"].reshape(-1) for s in adam.values()]).numpy(),
                "state_steps": [float(s["step"]) for s in state["state"].values()]}
    finally:
        client.close()
