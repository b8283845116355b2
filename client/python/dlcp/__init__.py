"""dlcp: gradient aggregation for data-parallel training.

    client = dlcp.Client(aggregators="10.0.0.1:7070,10.0.0.2:7070", job="resnet",
                         world_size=4, rank=0, loss_bound=0.01)
    stats = client.allreduce(0, tensor)          # sums in place over the job's workers
    handle = client.allreduce_async(1, other)    # returns at once; handle.wait() -> stats

Tensors are float32 and contiguous: torch CPU tensors, numpy arrays, or anything with the
buffer protocol. The data is used in place (no copy) and must be left alone until the op is
done. CUDA tensors (float32, float16 or bfloat16) go through the CUDA packer, which reads them
on the GPU, and the aggregate is written back to the device; where no CUDA device is usable
(cuda_status() says why) they are staged through host memory. Errors raise a dlcp.Error of the
status code's class (dlcp.AbortedError, dlcp.DeadlineExceededError, ...; dlcp.errors), with the
reason; nothing here aborts the interpreter.
"""
import atexit
import os
import queue
import threading
import time
import weakref
from typing import List, NamedTuple

from . import _dlcp, _logs, errors
from ._logs import set_log_level
from .errors import *  # noqa: F401,F403 (dlcp.Error and a class per status code)
from .errors import DeadlineExceededError, Error, InvalidArgumentError, UnavailableError

_dlcp._register_errors(errors.BY_NUMBER)
_logs._start()
__version__ = _dlcp.__version__  # the release of the library this package was built with

__all__ = ["Client", "Handle", "HostStage", "cuda_status", "default_client", "resolve_aggregators", "set_log_level"] + errors.__all__


def cuda_status():
    """None when CUDA tensors go through the CUDA packer; otherwise the reason they cannot
    (a build without CUDA, or no usable device) and they are staged through host memory."""
    return _dlcp.cuda_status()


# What dlcp sums: on a device through the CUDA packer, on the host through a float32 copy.
_SUMMED_DTYPES = ("float32", "float16", "bfloat16")


def _as_device_tensor(tensor):
    """For a CUDA tensor the CUDA packer can read: the contiguous tensor to hand over, a function
    that puts the result back (None when it is the tensor itself), and a CUDA event recorded on
    the tensor's current stream after the work that produces it. Otherwise None."""
    if not getattr(tensor, "is_cuda", False) or _dlcp.cuda_status() is not None:
        return None
    import torch
    if _dtype_name(tensor) not in _SUMMED_DTYPES:
        return None
    t = tensor.detach()
    finish = None
    if not t.is_contiguous():
        t = t.contiguous()
        finish = lambda: tensor.copy_(t)  # noqa: E731
    # The packer reads on its own stream, so whatever produced the tensor must be done first. The
    # event marks that point without holding the stream or the caller (a backward hook runs on
    # autograd's thread, which would stop feeding the GPU); the submitter waits for it.
    ready = torch.cuda.Event()
    ready.record(torch.cuda.current_stream(t.device))
    return t, finish, ready


def _ready_within(event, timeout_s, key):
    """A wait for `event` (a CUDA event) of at most timeout_s seconds, for the submitter. It looks
    at the event and sleeps between looks, a little longer each time up to half a millisecond:
    torch's Event.synchronize has no deadline, and spins a core while it waits."""
    def wait():
        deadline = time.monotonic() + timeout_s
        pause = 20e-6
        while not event.query():
            if time.monotonic() > deadline:
                raise DeadlineExceededError(f"DEADLINE_EXCEEDED: key {key}'s CUDA tensor was not ready within the "
                                            f"op timeout ({timeout_s:g} s): the work on its stream never finished")
            time.sleep(pause)
            pause = min(2 * pause, 5e-4)
    return wait


class _DeferredOp:
    """An op the submitter has not handed to the client yet; a Handle's inner op until it has."""

    def __init__(self):
        self._submitted = threading.Event()
        self._inner = None
        self._error = None

    def done(self):
        return self._submitted.is_set() and (self._error is not None or self._inner.done())

    def wait(self, timeout=None):
        start = time.monotonic()
        if not self._submitted.wait(timeout):
            raise DeadlineExceededError(f"DEADLINE_EXCEEDED: dlcp op still waiting for its tensor's stream after "
                                        f"{timeout} s")
        if self._error is not None:
            raise self._error
        return self._inner.wait(None if timeout is None else max(0.0, timeout - (time.monotonic() - start)))

    def _settle(self, inner=None, error=None):
        self._inner, self._error = inner, error
        self._submitted.set()


class _Submitter:
    """A client's thread that submits device ops once their tensors are ready, in the order they
    came, so that no caller blocks on the GPU. Made at the first op that must wait."""

    def __init__(self):
        self._queue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="dlcp-submit", daemon=True)
        self._thread.start()

    def submit(self, wait_ready, submit, callback=None):
        """`submit()` once `wait_ready()` returned; its error fails the op (and reaches callback)."""
        op = _DeferredOp()
        self._queue.put((op, wait_ready, submit, callback))
        return op

    def close(self, timeout=10):
        """Submits what is queued (to a closed client, which fails it), then ends the thread."""
        self._queue.put(None)
        if threading.current_thread() is not self._thread:  # closed from a callback: it ends by itself
            self._thread.join(timeout)

    def _run(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            op, wait_ready, submit, callback = item
            try:
                wait_ready()
                op._settle(inner=submit())
            except Exception as e:  # noqa: BLE001 (the op's error, for wait() and the callback)
                op._settle(error=e)
                if callback is not None:
                    try:
                        callback(None, str(e))
                    except Exception:  # noqa: BLE001 (as the completion thread does: reported, not fatal)
                        _logs.logger.exception("dlcp: a completion callback raised")


_open_clients = weakref.WeakSet()
_open_lock = threading.Lock()


def _close_all():
    with _open_lock:
        clients = list(_open_clients)
    for c in clients:
        c.close()


# Completion threads must be gone before the interpreter tears down.
atexit.register(_close_all)


def resolve_aggregators(service):
    """"host:port" of a headless Service (e.g. "dlcpd.dlcp.svc:7400") -> "ip:port,ip:port,...":
    every aggregator behind the name, sorted, so that every worker builds the same list. Its IPv4
    addresses where it has any, else its IPv6 ones, bracketed ("[fd00::7]:7400"): one family, as
    a job's data plane runs over one."""
    import ipaddress
    import socket
    host, sep, port = service.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InvalidArgumentError(f"INVALID_ARGUMENT: aggregator service '{service}' is not host:port")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        infos = socket.getaddrinfo(host, int(port), socket.AF_UNSPEC, socket.SOCK_STREAM)
    except OSError as e:
        raise UnavailableError(f"UNAVAILABLE: cannot resolve aggregator service '{host}': {e}") from None
    v4 = {info[4][0] for info in infos if info[0] == socket.AF_INET}
    v6 = {info[4][0] for info in infos if info[0] == socket.AF_INET6}
    addrs = sorted(v4 or v6, key=ipaddress.ip_address)
    return ",".join(f"{a}:{port}" if a in v4 else f"[{a}]:{port}" for a in addrs)


def _dtype_name(tensor):
    return str(getattr(tensor, "dtype", "")).replace("torch.", "")


def _check_dtype(tensor):
    """A torch tensor or numpy array holds a dtype dlcp sums, or TypeError names it. float16 and
    bfloat16 are widened to float32 for the sum and narrowed back; float64 and the integer types
    are refused rather than narrowed without a word."""
    dtype = getattr(tensor, "dtype", None)
    if dtype is None:
        return  # another buffer: the binding checks its format
    if _dtype_name(tensor) not in _SUMMED_DTYPES:
        raise TypeError(f"dlcp sums float32, float16 and bfloat16 tensors, not {_dtype_name(tensor)}: cast it "
                        f"(tensor.float()) and back, if float32's precision is enough for it")


def _as_buffer(tensor):
    """A writable float32 buffer sharing the tensor's memory, and a function that puts the
    result back where it belongs (None when the buffer is the tensor itself)."""
    _check_dtype(tensor)
    if hasattr(tensor, "is_cuda"):  # a torch tensor
        import torch
        if tensor.is_cuda or tensor.dtype != torch.float32 or not tensor.is_contiguous():
            host = tensor.detach().to("cpu", torch.float32).contiguous()
            return host.numpy(), lambda: tensor.copy_(host)
        return tensor.detach().numpy(), None
    if _dtype_name(tensor) not in ("", "float32"):  # numpy float16: no bfloat16 there to share code with
        import numpy
        host = numpy.ascontiguousarray(tensor, dtype=numpy.float32)
        return host, lambda: tensor.__setitem__(Ellipsis, host)
    return tensor, None


def _check_index(name, value, limit):
    """An op's key, layer or root: an int in [0, limit), else TypeError or ValueError naming it."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not 0 <= value < limit:
        raise ValueError(f"{name} must be in [0, {limit}), not {value}")


class Handle:
    """An op in flight. wait() blocks without holding the GIL; done() polls."""

    def __init__(self, inner, finish=None):
        """Made by Client.allreduce_async and broadcast_async, not by callers."""
        self._inner = inner
        self._finish = finish

    def done(self):
        """Whether the op has completed (successfully or not); never blocks."""
        return self._inner.done()

    def wait(self, timeout=None):
        """Blocks until the op completes, at most `timeout` seconds (None: the client's
        op_timeout_ms bounds it); returns the round's stats (a dict), or raises the dlcp.Error of
        its failure (DeadlineExceededError when the timeout ran out first)."""
        stats = self._inner.wait(timeout)
        if self._finish is not None:
            self._finish()
            self._finish = None
        return stats


# What torch.distributed's launchers export to every worker: torchrun and torch.distributed.launch
# (RANK, WORLD_SIZE), and Kubeflow's PyTorchJob (RANK, WORLD_SIZE). The job's name, when not
# given, the library takes from the launcher itself (TORCHELASTIC_RUN_ID, MASTER_ADDR:MASTER_PORT).
_LAUNCHER_VARS = (("rank", "RANK"), ("world_size", "WORLD_SIZE"))


def _given(option, options, env):
    """Whether the caller or a DLCP_* environment variable set `option`: those win over a launcher."""
    return option in options or "DLCP_" + option.upper() in env


def _launcher_defaults(options, env):
    """Fills rank and world_size from a launcher's environment where neither the caller nor a
    DLCP_* variable gave them."""
    for option, var in _LAUNCHER_VARS:
        if _given(option, options, env) or var not in env:
            continue
        try:
            options[option] = int(env[var])
        except ValueError:
            raise InvalidArgumentError(f"{option}: the launcher's {var}={env[var]!r} is not a whole number") from None


# Options a worker cannot do without: a default would join the wrong job or sum the wrong count.
_REQUIRED = ("aggregators", "world_size", "rank")


def _require(options, env):
    missing = [o for o in _REQUIRED if options.get(o) is None and not env.get("DLCP_" + o.upper())]
    if missing:
        names = ", ".join(missing)
        launcher = " (a launcher's RANK and WORLD_SIZE also give them)" if set(missing) - {"aggregators"} else ""
        raise TypeError(f"dlcp.Client() is missing required option(s) {names}: pass them as keywords or set "
                        f"{', '.join('DLCP_' + o.upper() for o in missing)}{launcher}")


def default_client():
    """The process's one open Client, for the helpers that take `client=None`
    (dlcp.torch.broadcast_parameters, ...). ValueError when there is none or more than one."""
    with _open_lock:
        clients = list(_open_clients)
    if len(clients) != 1:
        raise ValueError(f"{len(clients)} dlcp clients are open in this process; pass client= to choose one")
    return clients[0]


class HostStage(NamedTuple):
    """Client.host_stage: where a worker's ops go."""
    formed: bool
    ranks: List[int]
    local_rank: int
    local_size: int
    pushes: bool
    whole_job: bool
    why_not: str


class Client:
    """A worker's connection to its job's aggregators.

    Under torchrun, torch.distributed.launch or a Kubeflow PyTorchJob, rank and world_size default
    to the launcher's RANK and WORLD_SIZE, and job to torchrun's TORCHELASTIC_RUN_ID (its
    --rdzv_id) or else MASTER_ADDR:MASTER_PORT; options given here win. Outside a launcher, job
    must be given: two runs with one name would be summed together.

    Keyword options: each may also come from the environment as DLCP_<NAME> (DLCP_LOSS_BOUND=0.05),
    which a keyword wins over; then the default. None counts as not given. The options:
{options}
    Methods may be called from any thread.
    """

    def __init__(self, **options):
        """Connects to the job's aggregators; the options are the class's (help(dlcp.Client)).
        aggregators, world_size and rank are required: as keywords, DLCP_* variables or (rank and
        world_size) a launcher's. TypeError for a missing option or a value of the wrong type,
        ValueError for a bad value, dlcp.Error when the aggregators refuse or cannot be reached."""
        _launcher_defaults(options, os.environ)
        _require(options, os.environ)
        _logs._forwarder.sync()  # the logger's level and handlers as they are now, from the first line
        self._inner = _dlcp.Client(**options)
        self._deferred = None  # the _Submitter, once an op had to wait for its tensor
        self._deferred_lock = threading.Lock()
        with _open_lock:
            _open_clients.add(self)

    def _submitter(self):
        with self._deferred_lock:
            if self._deferred is None:
                self._deferred = _Submitter()
            return self._deferred

    @property
    def rank(self):
        """This worker's rank in the job, 0 .. world_size - 1."""
        return self._inner.rank

    @property
    def world_size(self):
        """The job's worker count."""
        return self._inner.world_size

    @property
    def job_id(self):
        """The job's number, which the aggregators gave it (in their metrics and logs)."""
        return self._inner.job_id

    @property
    def job(self):
        """The job's name: what every worker of the job joined with."""
        return self._inner.job

    @property
    def host_stage(self):
        """Whether this worker's ops go through a host stage now (docs/host-stage.md), as a
        HostStage: formed, ranks (the stage's, ascending), local_rank, local_size, pushes (this
        worker pushes the stage's sum), whole_job (the stage holds the whole job) and why_not (why
        there is none: host_stage off, local_size 1, no dlcpd at host_socket, a refusal, a member
        gone). A stage that lost a member reads as not formed until it forms again."""
        return HostStage(**self._inner.host_stage())

    @property
    def local_rank(self):
        """This worker's place among the job's workers on its host: its host stage's, else the
        launcher's LOCAL_RANK, else 0."""
        stage = self.host_stage
        if stage.formed:
            return stage.local_rank
        return int(os.environ.get("LOCAL_RANK", "0") or 0)

    @property
    def local_size(self):
        """How many of the job's workers run on this host: its host stage's size, else the
        local_size option (LOCAL_WORLD_SIZE), else 1."""
        return self.host_stage.local_size

    def rejects(self):
        """Data packets this client dropped since it connected, by reason ({"bad_mac": 3, ...}):
        forged or corrupted packets, packets from unknown addresses, late copies of results
        (unknown_round). Only reasons that occurred are listed. Still readable after close()."""
        return self._inner.rejects()

    def rx_overflows(self):
        """Result datagrams the kernel dropped since the client connected because its receive
        buffer was full: loss on this host, not the network, which repairs make good (raise
        net.core.rmem_max). Not among rejects(). 0 over RDMA. Still readable after close()."""
        return self._inner.rx_overflows()

    def rx_queue_ran_dry(self):
        """Over RDMA, how often the client's receive queue ran out of posted buffers since it
        connected: the NIC then drops what arrives, counted only in the port's sysfs
        hw_counters (mlx5: out_of_buffer). Episodes, not datagrams; loss on this host, which
        repairs make good (raise rdma_recv_slots). 0 over UDP. Still readable after close()."""
        return self._inner.rx_queue_ran_dry()

    def port_counters(self):
        """Over RDMA, the counters of the NIC port the client's data plane runs on, by name, as
        its driver exports them in sysfs hw_counters ({"out_of_buffer": 0, ...} on mlx5): what no
        verbs call counts, such as the datagrams the NIC dropped for want of a posted receive
        buffer. The port's counts since it came up, every process on it included: take
        differences. {} over UDP. Reads files: call it from a monitoring thread, not a
        callback. Still readable after close()."""
        return self._inner.port_counters()

    def allreduce_async(self, key, tensor, *, layer=0, loss_bound=None, callback=None, encoding=None,
                        report_classes=False, name=""):
        """Starts summing `tensor` over the job's workers, in place, and returns a Handle.

        key: the tensor's number, the same on every worker, in [0, 2**32). layer: its depth in
        the model, for the priority policy. loss_bound: ε for this op (None: the client's).
        `callback(stats, error)` runs on the client's completion thread once the op is done
        (error is a str or None). encoding ("f32" | "f16" | "bf16") overrides the client's
        payload_encoding for this op. report_classes: the stats carry "classes", the class this
        worker gave each chunk (a byte per chunk, in chunk order). name: what the op is called on
        the timeline (option timeline). TypeError for a dtype dlcp does not sum (float64, ints)."""
        _check_index("key", key, 1 << 32)
        _check_index("layer", layer, 1 << 32)
        if loss_bound is not None and (isinstance(loss_bound, bool) or not isinstance(loss_bound, (int, float))):
            raise TypeError(f"loss_bound must be a float or None, not {type(loss_bound).__name__}")
        if loss_bound is not None and not 0 <= loss_bound < 1:
            raise ValueError(f"loss_bound must be in [0, 1), not {loss_bound}")
        bound = -1.0 if loss_bound is None else loss_bound
        device = _as_device_tensor(tensor)
        if device is not None:
            t, finish, ready = device
            cb = _wrap_callback(callback, finish)

            def submit():
                return self._inner.submit_device(key, t.data_ptr(), str(t.dtype).replace("torch.", ""), t.numel(),
                                                 t.device.index or 0, t, layer=layer, loss_bound=bound,
                                                 encoding=encoding, report_classes=report_classes, callback=cb,
                                                 name=name)

            inner = submit() if ready.query() else self._submitter().submit(
                _ready_within(ready, self._inner.op_timeout_s, key), submit, cb)
            return Handle(inner, None if cb is not None else finish)
        buf, finish = _as_buffer(tensor)
        cb = _wrap_callback(callback, finish)
        inner = self._inner.submit(key, buf, layer=layer, loss_bound=bound, encoding=encoding,
                                   report_classes=report_classes, callback=cb, name=name)
        return Handle(inner, None if cb is not None else finish)

    def allreduce(self, key, tensor, *, layer=0, loss_bound=None, timeout=None, encoding=None,
                  report_classes=False, name=""):
        """allreduce_async(...).wait(timeout): sums `tensor` in place and returns the round's stats.
        timeout in seconds (None: the client's op_timeout_ms bounds it)."""
        return self.allreduce_async(key, tensor, layer=layer, loss_bound=loss_bound, encoding=encoding,
                                    report_classes=report_classes, name=name).wait(timeout)

    def broadcast_async(self, key, tensor, root, *, callback=None):
        """Replaces `tensor` on every worker with root's, exactly (reliable whatever ε is)."""
        _check_index("key", key, 1 << 32)
        _check_index("root", root, self.world_size)
        buf, finish = _as_buffer(tensor)
        cb = _wrap_callback(callback, finish)
        inner = self._inner.submit(key, buf, root=root, callback=cb)
        return Handle(inner, None if cb is not None else finish)

    def broadcast(self, key, tensor, root, *, timeout=None):
        """broadcast_async(...).wait(timeout)."""
        return self.broadcast_async(key, tensor, root).wait(timeout)

    def close(self):
        """Leaves the job; ops still pending fail. Idempotent."""
        with _open_lock:
            _open_clients.discard(self)
        self._inner.close()
        with self._deferred_lock:
            submitter, self._deferred = self._deferred, None
        if submitter is not None:
            submitter.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _options_doc():
    """The option list of Client's docstring, from the one option table (docs/configuration.md's too)."""
    lines = []
    for row in _dlcp.client_options():
        choices = f" ({row['choices'].replace('|', ' | ')})" if row["choices"] else ""
        default = f"; default {row['default']}" if row["default"] else ""
        lines.append(f"      {row['name']}{choices}: {row['help']}{default}.")
    return "\n".join(lines)


_TYPES = {"bool": bool, "int": int, "float": float, "str": str}


def _typed_default(row):
    text, kind = row["default"], row["type"]
    if kind == "bool":
        return text == "true"
    if kind in ("int", "float"):
        return _TYPES[kind](text) if text else None
    return text


def _signature():
    """Client's signature for help() and inspect: every option keyword-only, with its type and
    default; the required ones without a default."""
    import inspect
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for row in _dlcp.client_options():
        default = inspect.Parameter.empty if row["name"] in _REQUIRED else _typed_default(row)
        params.append(inspect.Parameter(row["name"], inspect.Parameter.KEYWORD_ONLY, default=default,
                                        annotation=_TYPES[row["type"]]))
    return inspect.Signature(params)


Client.__doc__ = Client.__doc__.replace("{options}", _options_doc())
Client.__init__.__signature__ = _signature()


def _wrap_callback(callback, finish):
    if callback is None:
        return None

    def done(stats, error):
        if error is None and finish is not None:
            finish()
        callback(stats, error)

    return done
