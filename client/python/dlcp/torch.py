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
import contextlib
import io
import time

import torch

from . import Error, errors
from . import default_client as _default_client
from .fusion import FusionTuner

__all__ = ["comm_hook", "DistributedOptimizer", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters",
           "num_layers"]

# RoundStats fields DistributedOptimizer.totals sums over its rounds.
_TOTALS = ("injected_drops", "droppable_total", "droppable_missing", "bound_violations", "pull_missing",
           "retransmits")

_HOOK_KEYS = 1 << 20       # comm_hook: key = _HOOK_KEYS + bucket index
_OPTIMIZER_KEYS = 1 << 24  # DistributedOptimizer: + generation * _GENERATION + group
_GENERATION = 1 << 16
_BROADCAST_SLOT = _GENERATION - 1  # parameter broadcasts (key_base + this)
_TUNER_KEY = (1 << 24) - 1         # the tuner's decision
_PARAMETER_KEY = (1 << 24) - 2     # broadcast_parameters
_OBJECT_KEY = (1 << 24) - 4        # broadcast_object: its size, then its blocks (+ 1)
_OBJECT_BLOCK_BYTES = 1 << 18


def num_layers(model):
    """The depth dlcp's priority policy sees: one layer per parameter, in registration order."""
    return sum(1 for _ in model.parameters())


def _layer_index(model):
    return {id(p): i for i, p in enumerate(model.parameters())} if model is not None else {}


def comm_hook(client, model=None, *, loss_bound=None, key_base=_HOOK_KEYS):
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
        # A CUDA-aware future for a CUDA bucket: set_result records an event after the division,
        # and DDP's wait makes its stream wait for it.
        future = torch.futures.Future(devices=[buffer.device]) if buffer.is_cuda else torch.futures.Future()

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


_SUMMED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def broadcast_parameters(model, root=0, *, client=None, key=_PARAMETER_KEY, timeout=None):
    """Makes every worker's parameters and buffers (model.state_dict()) equal to `root`'s,
    exactly; call it on every worker before training. float32, float16 and bfloat16 tensors travel
    as one float32 tensor; others (float64, integer counters) through broadcast_object.
    client: None for dlcp.default_client(). key: the tensor key it uses; another model needs
    another key."""
    client = client if client is not None else _default_client()
    state = [t for t in model.state_dict(keep_vars=True).values() if isinstance(t, torch.Tensor)]
    floats = [t for t in state if t.dtype in _SUMMED_DTYPES and t.numel() > 0]
    others = [t for t in state if t.dtype not in _SUMMED_DTYPES]
    with torch.no_grad():
        if floats:
            flat = torch.cat([t.detach().reshape(-1).to("cpu", torch.float32) for t in floats])
            client.broadcast(key, flat, root, timeout=timeout)
            offset = 0
            for t in floats:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()
        if others:
            values = broadcast_object([t.detach().cpu() for t in others], root, client=client, timeout=timeout)
            for t, v in zip(others, values):
                t.copy_(v)


def broadcast_optimizer_state(optimizer, root=0, *, client=None, timeout=None):
    """Makes every worker's optimizer state (state_dict(): moments, step counts, learning rates)
    equal to `root`'s, for a run that resumes from a checkpoint only root loaded. Works on a
    torch.optim optimizer and on DistributedOptimizer. client: None for dlcp.default_client()."""
    client = client if client is not None else _default_client()
    state = optimizer.state_dict() if client.rank == root else None
    state = broadcast_object(state, root, client=client, timeout=timeout)
    optimizer.load_state_dict(state)


def broadcast_object(obj, root=0, *, client=None, timeout=None):
    """`root`'s obj on every worker, through torch.save and torch.load (tensors come back on the
    CPU). The bytes travel as float32 values each holding 16 bits, which every sum keeps exact.
    Only the job's own workers send into its rounds, but root's bytes are unpickled: use it for
    what the job's own code made."""
    client = client if client is not None else _default_client()
    if client.rank == root:
        buffer = io.BytesIO()
        torch.save(obj, buffer)
        data = buffer.getvalue()
    else:
        data = b""
    header = _words(len(data).to_bytes(8, "little"))
    client.broadcast(_OBJECT_KEY, header, root, timeout=timeout)
    size = int.from_bytes(_bytes(header), "little")
    out = bytearray()
    for start in range(0, size, _OBJECT_BLOCK_BYTES):
        block = _words(data[start:start + _OBJECT_BLOCK_BYTES].ljust(_OBJECT_BLOCK_BYTES, b"\0"))
        client.broadcast(_OBJECT_KEY + 1, block, root, timeout=timeout)  # one size per key: every block is full
        out += _bytes(block)
    # Not weights_only (torch 2.6's default): an object may be more than tensors and containers.
    return torch.load(io.BytesIO(bytes(out[:size])), map_location="cpu", weights_only=False)


def _words(data):
    """bytes of even length -> a float32 tensor of their 16-bit words, each a whole number."""
    return torch.frombuffer(bytearray(data), dtype=torch.int16).to(torch.int32).bitwise_and(0xFFFF).to(torch.float32)


def _bytes(words):
    return words.to(torch.int32).to(torch.int16).numpy().tobytes()


_ACCEPTED_DTYPES = {"cpu": (torch.float32,), "cuda": _SUMMED_DTYPES}


class _Group:
    """A fusion group: parameters adjacent in forward order, of one device and dtype, pushed and
    pulled as one tensor on that device."""

    def __init__(self, index, params, key):
        self.index = index
        self.params = params
        self.key = key
        first = params[0]
        self.flat = torch.zeros(sum(p.numel() for p in params), dtype=first.dtype, device=first.device)
        self.views = []
        offset = 0
        for p in params:
            self.views.append(self.flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        self.ready = set()
        self.handle = None  # the op in flight; its result is applied before the group is used
        self.pushed_at = -1  # the step whose gradients were pushed last


def _trained_params(optimizer, model):
    """The parameters the optimizer updates, in its groups' order, without frozen ones; each the
    model's, on a device and of a dtype dlcp sums, else ValueError or TypeError naming it."""
    names = {id(p): n for n, p in model.named_parameters()}
    params, seen = [], set()
    for group in optimizer.param_groups:
        for p in group["params"]:
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))
            if id(p) not in names:
                raise ValueError("the optimizer updates a parameter the model does not have; give DistributedOptimizer "
                                 "the model whose parameters the optimizer was made with")
            accepted = _ACCEPTED_DTYPES.get(p.device.type)
            if accepted is None or p.dtype not in accepted:
                raise TypeError(f"parameter {names[id(p)]} is {str(p.dtype).replace('torch.', '')} on "
                                f"{p.device.type}: DistributedOptimizer takes float32 parameters on the CPU and "
                                f"float32, float16 or bfloat16 ones on CUDA devices")
            params.append(p)
    return params


class DistributedOptimizer:
    """Wraps any torch.optim optimizer with DeAR's schedule.

    - backward: each fusion group is pushed as soon as all its gradients are ready;
    - step(): only makes sure every group was pushed, then returns;
    - next forward: a pre-hook on each module waits for its group's aggregate and applies the
      update to that group's parameters, while later groups' pulls are still in flight.
    Call synchronize() before reading or saving the parameters outside the training loop.

    The parameters are those of the optimizer's parameter groups that require gradients (frozen
    ones are neither pushed nor updated); each must be the model's. CPU parameters are float32;
    CUDA ones float32, float16 or bfloat16, summed from device memory by the CUDA packer and
    written back in their dtype. A parameter without a gradient in a step contributes zeros.

    client: the Client to use (None: dlcp.default_client()). fusion_bytes: an int, or "auto" to
    tune it online (FusionTuner; `tune_warmup` steps excluded, `tune_steps` steps per trial).
    backward_passes_per_step: backward passes whose gradients are accumulated locally before they
    are pushed (no_sync() does the same for the passes inside it); scale the loss by its inverse
    for a mean. broadcast_every: with the bounded pull mode, rank 0's parameters are broadcast
    every K steps so replicas resynchronise. grad_scaler: a GradScaler whose step() calls this
    optimizer's, for a torch whose GradScaler does not pass itself (torch 1.13 to 2.x do); see
    step(). timeout: seconds each pull may take (None: the client's op_timeout_ms).
    """

    # GradScaler.step(optimizer) then calls step(grad_scaler=scaler) and leaves the inf checks
    # and the unscaling to it: they must see the aggregate, not this worker's gradients.
    _step_supports_amp_scaling = True

    def __init__(self, optimizer, model, client=None, *, fusion_bytes=4 << 20, loss_bound=None,
                 backward_passes_per_step=1, broadcast_every=0, grad_scaler=None, tune_trials=10, tune_warmup=3,
                 tune_steps=3, key_base=_OPTIMIZER_KEYS, timeout=None):
        """Hooks the model and broadcasts rank 0's parameters; the options are the class's."""
        if fusion_bytes != "auto" and (not isinstance(fusion_bytes, int) or fusion_bytes <= 0):
            raise ValueError(f"fusion_bytes must be a positive int or 'auto', not {fusion_bytes!r}")
        if tune_warmup < 1 or tune_steps < 1:
            raise ValueError("tune_warmup and tune_steps must be at least 1")
        if not isinstance(backward_passes_per_step, int) or backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be an int of at least 1, not {backward_passes_per_step!r}")
        self.optimizer = optimizer
        self._model = model
        self._client = client if client is not None else _default_client()
        self._loss_bound = loss_bound
        self._broadcast_every = broadcast_every
        self._passes_per_step = backward_passes_per_step
        self._grad_scaler = grad_scaler
        self._timeout = timeout
        self._key_base = key_base
        self._world = self._client.world_size
        self._params = _trained_params(optimizer, model)
        self._passes = collections.Counter()  # backward passes each parameter's gradient has seen this step
        self._sync = True  # False inside no_sync()
        self._layer = _layer_index(model)
        self._generation = 0
        self._groups = None
        self._group_of = {}
        self._module_order = []  # modules owning parameters, in the order the forward pass met them
        self._seen = set()
        self._steps = 0
        # Summed over every round this optimizer pulled: rounds, left_out (this worker's chunks
        # left out of aggregates), skipped_steps (AMP steps every worker skipped) and the RoundStats
        # fields in _TOTALS.
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
        """The wrapped optimizer's parameter groups (learning-rate schedulers change them here)."""
        return self.optimizer.param_groups

    @property
    def state(self):
        """The wrapped optimizer's state."""
        return self.optimizer.state

    @property
    def fusion_bytes(self):
        """The fusion group size in use (tuned online with fusion_bytes="auto")."""
        return self._fusion_bytes

    def state_dict(self):
        """The wrapped optimizer's state_dict, after every pull was applied."""
        self.synchronize()
        return self.optimizer.state_dict()

    def load_state_dict(self, state):
        """Loads into the wrapped optimizer, after every pull was applied."""
        self.synchronize()
        self.optimizer.load_state_dict(state)

    def zero_grad(self, set_to_none=True):
        """Clears the local gradients: to None, or zeros in place (set_to_none=False). What was
        pushed is already in the fusion buffers."""
        for p in self._params:
            if set_to_none or p.grad is None:
                p.grad = None
            else:
                p.grad.detach_()
                p.grad.zero_()

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside accumulate their gradients locally and push nothing; the first
        backward pass after it pushes the sum (as DistributedDataParallel.no_sync does)."""
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous

    def step(self, closure=None, grad_scaler=None):
        """Pushes the groups the backward passes did not (parameters without a gradient give
        zeros), and returns: the update is applied by the next forward pass.

        Under GradScaler.step(optimizer), which passes itself as grad_scaler, it waits for every
        pull instead: the aggregate is unscaled and checked for inf/NaN, and the wrapped optimizer
        steps only when it is finite. The aggregate is the same on every worker, so every worker
        skips the same steps and GradScaler.update() keeps the same scale on each."""
        if closure is not None:
            raise ValueError("DistributedOptimizer.step does not take a closure")
        scaler = grad_scaler if grad_scaler is not None else self._grad_scaler
        if scaler is None and getattr(self, "found_inf", None) is not None:
            raise ValueError("this torch's GradScaler did not pass itself to step(); give it to DistributedOptimizer "
                             "as grad_scaler=")
        self._ensure_groups()
        for g in self._groups:
            if g.pushed_at != self._steps:  # the backward passes did not reach all of its parameters
                self._apply(g)
                self._push(g, fill_missing=True)
        self._steps += 1
        if scaler is not None and scaler.is_enabled():
            self._scaled_step(scaler)
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
        """Makes every worker's parameters and buffers equal to `root`'s, exactly."""
        self.synchronize()
        broadcast_parameters(self._model, root, client=self._client, key=self._key_base + _BROADCAST_SLOT,
                             timeout=self._timeout)

    def close(self):
        """Removes the forward hooks; the model trains without dlcp afterwards."""
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
        trained = {id(p) for p in self._params}
        ordered, placed = [], set()
        for m in self._module_order:
            for p in m.parameters(recurse=False):
                if id(p) in trained and id(p) not in placed:
                    ordered.append(p)
                    placed.add(id(p))
        ordered += [p for p in self._params if id(p) not in placed]  # never met in forward
        groups, current, size = [], [], 0
        for p in ordered:
            nbytes = p.numel() * p.element_size()
            apart = current and (p.device, p.dtype) != (current[0].device, current[0].dtype)
            if current and (apart or size + nbytes > self._fusion_bytes):
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
            if not self._sync:
                return  # no_sync(): the gradient accumulates in p.grad
            self._passes[id(p)] += 1
            if self._passes[id(p)] < self._passes_per_step:
                return
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
        for p in g.params:
            self._passes[id(p)] = 0
        g.ready.clear()
        g.pushed_at = self._steps
        g.handle = self._client.allreduce_async(g.key, g.flat, layer=layer, loss_bound=self._loss_bound,
                                                name=f"fusion group {g.index}")

    def _wait(self, g):
        """Waits for the group's pull and averages it in place; False when none was in flight."""
        if g.handle is None:
            return False
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
        return True

    def _apply(self, g):
        """Waits for the group's pull and steps the wrapped optimizer on its parameters alone."""
        if self._wait(g):
            self._step_with(g.params, g.views)

    def _step_with(self, params, grads):
        """The wrapped optimizer's step on `params` with `grads`; the local gradients are left as
        they were (parameters without a gradient are skipped by every torch.optim optimizer)."""
        with torch.no_grad():
            saved = [p.grad for p in self._params]
            for p in self._params:
                p.grad = None
            for p, grad in zip(params, grads):
                p.grad = grad
            try:
                self.optimizer.step()
            finally:
                for p, grad in zip(self._params, saved):
                    p.grad = grad

    def _scaled_step(self, scaler):
        """AMP: every pull, then the scaler unscales the averaged aggregate and checks it."""
        for g in self._groups:
            self._wait(g)
        saved = [p.grad for p in self._params]
        for g in self._groups:  # every trained parameter is in a group: all take the aggregate
            for p, view in zip(g.params, g.views):
                p.grad = view
        try:
            scaler.unscale_(self)  # records found_inf per device, from the aggregate
            found = scaler._per_optimizer_states[id(self)]["found_inf_per_device"]
            if sum(v.item() for v in found.values()) == 0:
                self.optimizer.step()
            else:
                self.totals["skipped_steps"] += 1
        finally:
            for p, grad in zip(self._params, saved):
                p.grad = grad

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
