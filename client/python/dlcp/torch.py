"""PyTorch integration: a DDP communication hook and a DeAR-style pipelined optimizer.

DDP users (keep DDP, replace its all-reduce):
    client = dlcp.Client(aggregators=..., world_size=W, rank=r, num_layers=dlcp.torch.num_layers(model))
    ddp.register_comm_hook(None, dlcp.torch.comm_hook(client, model))

Optimizer users (no DDP; pushes overlap backward, pulls overlap the next forward):
    client = dlcp.Client(aggregators=..., world_size=W, rank=r, num_layers=dlcp.torch.num_layers(model))
    optimizer = dlcp.torch.DistributedOptimizer(torch.optim.Adam(model.parameters()), model, client)

Gradients are averaged over the workers. Under a loss bound, chunks left out of a round are
compensated by the aggregator (rescaled by the actual contributors) and carried into the next
round by the client's error feedback.
"""
import collections
import time

import torch

from . import Error, errors
from .fusion import FusionTuner

__all__ = ["comm_hook", "DistributedOptimizer", "num_layers"]

# RoundStats fields DistributedOptimizer.totals sums over its rounds.
_TOTALS = ("injected_drops", "droppable_total", "droppable_missing", "bound_violations", "pull_missing",
           "retransmits")

_HOOK_KEYS = 1 << 20       # comm_hook: key = _HOOK_KEYS + bucket index
_OPTIMIZER_KEYS = 1 << 24  # DistributedOptimizer: + generation * _GENERATION + group
_GENERATION = 1 << 16
_BROADCAST_SLOT = _GENERATION - 1  # parameter broadcasts (key_base + this)
_TUNER_KEY = (1 << 24) - 1         # the tuner's decision


def num_layers(model):
    """The depth dlcp's priority policy sees: one layer per parameter, in registration order."""
    return sum(1 for _ in model.parameters())


def _layer_index(model):
    return {id(p): i for i, p in enumerate(model.parameters())} if model is not None else {}


def comm_hook(client, model=None, loss_bound=None, key_base=_HOOK_KEYS):
    """A hook for DistributedDataParallel.register_comm_hook(state=None, hook=...).

    Each bucket is summed through dlcp and divided by the world size. The returned Future is
    completed on the dlcp client's completion thread, so no Python thread waits for the network.
    With `model`, each bucket's layer (its earliest parameter) feeds the priority policy.
    """
    layers = _layer_index(model)
    world = client.world_size

    def hook(state, bucket):
        buffer = bucket.buffer()
        layer = min((layers.get(id(p), 0) for p in bucket.parameters()), default=0)
        future = torch.futures.Future()

        def done(stats, error):
            if error is not None:
                future.set_exception(errors.from_text(error, f"dlcp all-reduce of DDP bucket {bucket.index()}: "))
                return
            buffer.div_(world)
            future.set_result(buffer)

        try:
            client.allreduce_async(key_base + bucket.index(), buffer, layer=layer, loss_bound=loss_bound,
                                   name=f"bucket {bucket.index()}",
                                   callback=done)
        except Exception as e:  # refused at submission: fail the future, not the backward pass
            future.set_exception(e)
        return future

    return hook


class _Group:
    """A fusion group: parameters adjacent in forward order, pushed and pulled as one tensor."""

    def __init__(self, index, params, key):
        self.index = index
        self.params = params
        self.key = key
        self.flat = torch.zeros(sum(p.numel() for p in params), dtype=torch.float32)
        self.views = []
        offset = 0
        for p in params:
            self.views.append(self.flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        self.ready = set()
        self.handle = None  # the op in flight; its result is applied before the group is used
        self.pushed_at = -1  # the step whose gradients were pushed last


class DistributedOptimizer:
    """Wraps any torch.optim optimizer with DeAR's schedule.

    - backward: each fusion group is pushed as soon as all its gradients are ready;
    - step(): only makes sure every group was pushed, then returns;
    - next forward: a pre-hook on each module waits for its group's aggregate and applies the
      update to that group's parameters, while later groups' pulls are still in flight.
    Call synchronize() before reading or saving the parameters outside the training loop.

    fusion_bytes: an int, or "auto" to tune it online (FusionTuner; `tune_warmup` steps
    excluded, `tune_steps` steps per trial). broadcast_every: with the bounded pull mode, rank 0's
    parameters are broadcast every K steps so replicas resynchronise. One backward per step.
    """

    def __init__(self, optimizer, model, client, fusion_bytes=4 << 20, loss_bound=None, broadcast_every=0,
                 tune_trials=10, tune_warmup=3, tune_steps=3, key_base=_OPTIMIZER_KEYS, timeout=None):
        if fusion_bytes != "auto" and (not isinstance(fusion_bytes, int) or fusion_bytes <= 0):
            raise ValueError(f"fusion_bytes must be a positive int or 'auto', not {fusion_bytes!r}")
        if tune_warmup < 1 or tune_steps < 1:
            raise ValueError("tune_warmup and tune_steps must be at least 1")
        self.optimizer = optimizer
        self._model = model
        self._client = client
        self._loss_bound = loss_bound
        self._broadcast_every = broadcast_every
        self._timeout = timeout
        self._key_base = key_base
        self._world = client.world_size
        self._params = [p for p in model.parameters() if p.requires_grad]
        for p in self._params:
            if p.dtype != torch.float32 or p.is_cuda:
                raise ValueError("DistributedOptimizer handles float32 CPU parameters")
        self._layer = _layer_index(model)
        self._generation = 0
        self._groups = None
        self._group_of = {}
        self._module_order = []  # modules owning parameters, in the order the forward pass met them
        self._seen = set()
        self._steps = 0
        # Summed over every round this optimizer pulled: rounds, left_out (this worker's chunks
        # left out of aggregates) and the RoundStats fields in _TOTALS.
        self.totals = collections.Counter()
        self._tuner = None
        if fusion_bytes == "auto":
            self._tuner = FusionTuner(trials=tune_trials)
            self._tune_warmup, self._tune_steps = tune_warmup, tune_steps
            self._fusion_bytes = self._agree_on(self._tuner.suggest_bytes())
            self._trial_start, self._trial_step = 0.0, 0
        else:
            self._fusion_bytes = fusion_bytes
        self._hooks = []
        for m in model.modules():
            if any(True for _ in m.parameters(recurse=False)):
                self._hooks.append(m.register_forward_pre_hook(self._pre_forward))
        self._grad_accs = []  # kept alive: the hooks live on them
        for p in self._params:
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            acc.register_hook(self._make_grad_hook(p))
            self._grad_accs.append(acc)
        self.broadcast_parameters(root=0)

    # ---- the optimizer's face ----
    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    @property
    def fusion_bytes(self):
        return self._fusion_bytes

    def state_dict(self):
        self.synchronize()
        return self.optimizer.state_dict()

    def load_state_dict(self, state):
        self.synchronize()
        self.optimizer.load_state_dict(state)

    def zero_grad(self, set_to_none=True):
        # Gradients were copied into the fusion buffers when pushed; nothing to clear but them.
        for p in self._params:
            p.grad = None

    def step(self, closure=None):
        if closure is not None:
            raise ValueError("DistributedOptimizer.step does not take a closure")
        self._ensure_groups()
        for g in self._groups:
            if g.pushed_at != self._steps:  # the backward did not reach all of its parameters
                self._apply(g)
                self._push(g, fill_missing=True)
        self._steps += 1
        if self._broadcast_every and self._steps % self._broadcast_every == 0:
            self.synchronize()
            self.broadcast_parameters(root=0)
        if self._tuner is not None:
            self._tune_tick()

    def synchronize(self):
        """Waits for every pull and applies it; afterwards the parameters are up to date."""
        if self._groups is None:
            return
        for g in self._groups:
            self._apply(g)

    def broadcast_parameters(self, root=0):
        """Makes every worker's parameters equal to `root`'s, exactly."""
        self.synchronize()
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1) for p in self._params])
            self._client.broadcast(self._key_base + _BROADCAST_SLOT, flat, root, timeout=self._timeout)
            offset = 0
            for p in self._params:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def close(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []

    # ---- internals ----
    def _pre_forward(self, module, inputs):
        if module not in self._seen:
            self._seen.add(module)
            self._module_order.append(module)
        if self._groups is None:
            return
        last = max((self._group_of[id(p)] for p in module.parameters(recurse=False) if id(p) in self._group_of),
                   default=-1)
        for g in self._groups[: last + 1]:
            self._apply(g)

    def _ensure_groups(self):
        if self._groups is not None:
            return
        ordered, placed = [], set()
        for m in self._module_order:
            for p in m.parameters(recurse=False):
                if p.requires_grad and id(p) not in placed:
                    ordered.append(p)
                    placed.add(id(p))
        ordered += [p for p in self._params if id(p) not in placed]  # never met in forward
        groups, current, size = [], [], 0
        for p in ordered:
            nbytes = p.numel() * 4
            if current and size + nbytes > self._fusion_bytes:
                groups.append(current)
                current, size = [], 0
            current.append(p)
            size += nbytes
        if current:
            groups.append(current)
        if len(groups) >= _BROADCAST_SLOT:
            raise ValueError(f"{len(groups)} fusion groups; raise fusion_bytes")
        base = self._key_base + self._generation * _GENERATION
        self._groups = [_Group(i, ps, base + i) for i, ps in enumerate(groups)]
        self._group_of = {id(p): g.index for g in self._groups for p in g.params}

    def _make_grad_hook(self, p):
        def hook(*_):
            self._ensure_groups()
            g = self._groups[self._group_of[id(p)]]
            if g.handle is not None:
                self._apply(g)  # a pull the forward pass never needed (unused module)
            g.ready.add(id(p))
            if len(g.ready) == len(g.params):
                self._push(g)
        return hook

    def _push(self, g, fill_missing=False):
        with torch.no_grad():
            for p, view in zip(g.params, g.views):
                if p.grad is not None:
                    view.copy_(p.grad)
                elif fill_missing:
                    view.zero_()
        layer = min(self._layer.get(id(p), 0) for p in g.params)
        g.ready.clear()
        g.pushed_at = self._steps
        g.handle = self._client.allreduce_async(g.key, g.flat, layer=layer, loss_bound=self._loss_bound,
                                                name=f"fusion group {g.index}")

    def _apply(self, g):
        if g.handle is None:
            return
        handle, g.handle = g.handle, None
        try:
            stats = handle.wait(self._timeout)
        except Error as e:
            raise type(e)(f"dlcp pull of fusion group {g.index}: {e}") from None
        self.totals["rounds"] += 1
        for name in _TOTALS:
            self.totals[name] += stats[name]
        self.totals["left_out"] += sum(stats["left_out_by_class"])
        with torch.no_grad():
            g.flat.div_(self._world)
            saved = [p.grad for p in self._params]
            for p in self._params:
                p.grad = None  # the wrapped optimizer skips parameters without gradients
            for p, view in zip(g.params, g.views):
                p.grad = view
            self.optimizer.step()
            for p, grad in zip(self._params, saved):
                p.grad = grad  # the local gradients, as plain PyTorch leaves them

    def _agree_on(self, nbytes):
        """Rank 0's value, on every worker."""
        t = torch.tensor([float(nbytes)], dtype=torch.float32)
        self._client.broadcast(_TUNER_KEY, t, 0, timeout=self._timeout)
        return int(t.item())

    def _tune_tick(self):
        """Each trial: `tune_warmup` steps at the new size, not measured, then `tune_steps`."""
        self._trial_step += 1
        if self._trial_step == self._tune_warmup:
            self._trial_start = time.perf_counter()
        elif self._trial_step == self._tune_warmup + self._tune_steps:
            self._tuner.observe((time.perf_counter() - self._trial_start) / self._tune_steps)
            final = self._tuner.finished
            size = self._agree_on(self._tuner.best_bytes() if final else self._tuner.suggest_bytes())
            if final:
                self._tuner = None
            self._trial_step = 0
            if size != self._fusion_bytes:
                self.synchronize()
                self._fusion_bytes = size
                self._generation += 1
                self._groups = None
                self._ensure_groups()
