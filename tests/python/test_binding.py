"""The dlcp Python binding: exact sums, broadcast, completion callbacks and clear errors."""
import inspect
import os
import pathlib
import threading
import time

import numpy as np
import pytest

import dlcp


def connect_all(aggregators, job, world, rank_options=lambda rank: {}, **options):
    """Connects every rank at once, each with `options` and its own `rank_options(rank)`."""
    clients = [None] * world
    errors = []

    def connect(rank):
        try:
            clients[rank] = dlcp.Client(aggregators=aggregators, job=job, world_size=world, rank=rank, plaintext=True,
                                        **options, **rank_options(rank))
        except Exception as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=connect, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return clients


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("elems", [1, 1000, 100_003])
def test_allreduce_sums_exactly(aggregators, world, elems):
    clients = connect_all(aggregators, f"sum-{world}-{elems}", world, loss_bound=0)
    try:
        rng = np.random.default_rng(elems)
        inputs = [rng.integers(-1000, 1000, elems).astype(np.float32) for _ in range(world)]
        expect = np.sum(inputs, axis=0, dtype=np.float64).astype(np.float32)  # integers: exact in fp32
        for round_ in range(3):
            bufs = [x.copy() for x in inputs]
            handles = [c.allreduce_async(7, b) for c, b in zip(clients, bufs)]
            stats = [h.wait(30) for h in handles]
            for b in bufs:
                assert np.array_equal(b, expect)
            assert all(s["round"] == round_ and s["min_contributors"] == world for s in stats)
    finally:
        for c in clients:
            c.close()


@pytest.mark.parametrize("adaptive", [True, False])
def test_window_settings_and_their_stats(aggregators, adaptive):
    # The NACK filter and pacing go on and off with the adaptive window here: off, the filter never
    # defers.
    clients = connect_all(aggregators, f"window-{adaptive}", 2, loss_bound=0, adaptive_window=adaptive,
                          nack_filter=adaptive, pacing=adaptive, congestion_delay_us=1000 if adaptive else 0,
                          window_bytes=1 << 20)
    try:
        bufs = [np.full(200_000, r + 1, dtype=np.float32) for r in range(2)]
        stats = [h.wait(30) for h in [c.allreduce_async(3, b) for c, b in zip(clients, bufs)]]
        for b in bufs:
            assert np.all(b == 3)
        for s in stats:
            assert s["window_cuts"] >= s["window_undos"] >= 0
            assert s["losses_tolerated"] >= 0 and s["tail_wait_s"] == 0  # a reliable round has no tail
            if not adaptive:
                assert s["window_cuts"] == 0
                assert s["losses_tolerated"] == 0
                assert s["nacks_deferred"] == 0
    finally:
        for c in clients:
            c.close()


def test_a_round_reports_each_chunks_class_when_asked(aggregators):
    # 40 chunks of 256 floats, chunk c holding c + 1: the 4 largest (10%) are class 0.
    clients = connect_all(aggregators, "classes", 2, loss_bound=0.01, chunk_bytes=1024)
    try:
        bufs = [np.repeat(np.arange(1, 41, dtype=np.float32) * (r + 1), 256) for r in range(2)]
        stats = [h.wait(30) for h in [c.allreduce_async(4, b, report_classes=True) for c, b in zip(clients, bufs)]]
        for s in stats:
            classes = list(s["classes"])
            assert len(classes) == 40
            assert [c == 0 for c in classes] == [i >= 36 for i in range(40)]
            assert [classes.count(k) for k in range(4)] == s["chunks_by_class"]
        bufs = [np.ones(40 * 256, dtype=np.float32) for _ in range(2)]
        stats = [h.wait(30) for h in [c.allreduce_async(4, b) for c, b in zip(clients, bufs)]]
        assert all("classes" not in s for s in stats)
    finally:
        for c in clients:
            c.close()


def test_torch_tensors_are_used_in_place(aggregators):
    torch = pytest.importorskip("torch")
    clients = connect_all(aggregators, "inplace", 2, loss_bound=0)
    try:
        a = torch.arange(5000, dtype=torch.float32)
        b = torch.full((5000,), 2.0)
        ptr = a.data_ptr()
        ha, hb = clients[0].allreduce_async(1, a), clients[1].allreduce_async(1, b)
        ha.wait(30), hb.wait(30)
        assert a.data_ptr() == ptr
        assert torch.equal(a, torch.arange(5000, dtype=torch.float32) + 2)
        assert torch.equal(a, b)
        # bfloat16, float16 and non-contiguous tensors go through a float32 copy and come back.
        for key, dtype in ((2, torch.bfloat16), (3, torch.float16)):
            c = torch.arange(12, dtype=dtype).view(3, 4).t()
            d = torch.ones(4, 3, dtype=dtype)
            hc, hd = clients[0].allreduce_async(key, c), clients[1].allreduce_async(key, d)
            hc.wait(30), hd.wait(30)
            assert c.dtype == dtype and torch.equal(c, torch.arange(12, dtype=dtype).view(3, 4).t() + 1)
    finally:
        for cl in clients:
            cl.close()


def test_a_dtype_that_would_be_narrowed_is_refused_by_name(aggregators):
    """float64 and integer tensors are refused, naming the dtype, rather than summed in float32
    without a word; numpy arrays likewise. Nothing is sent: the client still works."""
    torch = pytest.importorskip("torch")
    import numpy
    clients = connect_all(aggregators, "dtypes", 1, loss_bound=0)
    try:
        for bad, name in ((torch.ones(4, dtype=torch.float64), "float64"), (torch.ones(4, dtype=torch.int32), "int32"),
                          (numpy.ones(4), "float64")):
            with pytest.raises(TypeError, match=f"dlcp sums float32, float16 and bfloat16 tensors, not {name}"):
                clients[0].allreduce(7, bad, timeout=30)
        ok = torch.ones(4)
        clients[0].allreduce(7, ok, timeout=30)
        assert torch.equal(ok, torch.ones(4))
    finally:
        for cl in clients:
            cl.close()


WIRE_HEADER_BYTES = 48


def payload_bytes_sent(stats, tensor_bytes):
    # bytes_sent counts every push, repairs too: a loaded machine drops a datagram now and then.
    # Without repairs the payload is the tensor's bytes exactly; each repair adds one chunk, and
    # n chunks of equal size but a shorter last one are each smaller than tensor_bytes / (n - 1).
    n, repairs = stats["chunks"], stats["retransmits"]
    payload = stats["bytes_sent"] - WIRE_HEADER_BYTES * (n + repairs)
    largest_chunk = tensor_bytes if n == 1 else tensor_bytes // (n - 1)
    return tensor_bytes <= payload <= tensor_bytes + repairs * largest_chunk


@pytest.mark.parametrize("encoding", ["f16", "bf16"])
@pytest.mark.parametrize("drops", [None, "0:0.3,1:0.3,2:0.3,3:0.3"], ids=["lossless", "repaired"])
def test_sixteen_bit_encodings_sum_exactly(aggregators, encoding, drops):
    # Small integers are exact in float16 and bfloat16; one worker picks the encoding per op.
    # With drops injected, repairs carry the op's encoding too.
    lossy = {} if drops is None else {"inject_drop_class": drops, "inject_seed": 7}
    clients = connect_all(aggregators, f"enc-{encoding}-{drops is not None}", 2, loss_bound=0,
                          payload_encoding=encoding, chunk_bytes=1024, **lossy)
    try:
        inputs = [np.arange(3001, dtype=np.float32) % 50, np.full(3001, 3, dtype=np.float32)]
        bufs = [x.copy() for x in inputs]
        stats = [h.wait(30) for h in [c.allreduce_async(3, b) for c, b in zip(clients, bufs)]]
        assert all(np.array_equal(b, inputs[0] + inputs[1]) for b in bufs)
        assert all(payload_bytes_sent(s, 3001 * 2) for s in stats)  # 2-byte values on the wire
        if drops is not None:
            assert all(s["retransmits"] > 0 for s in stats)  # inject_seed fixes which are dropped
        bufs = [x.copy() for x in inputs]
        for h in [c.allreduce_async(4, b, encoding="f32") for c, b in zip(clients, bufs)]:
            assert payload_bytes_sent(h.wait(30), 3001 * 4)
        with pytest.raises(dlcp.Error, match="INVALID_ARGUMENT.*fp8"):
            clients[0].allreduce(5, bufs[0], encoding="fp8")
    finally:
        for c in clients:
            c.close()
    with pytest.raises(ValueError, match="payload_encoding.*int8"):
        dlcp.Client(aggregators=aggregators, world_size=1, rank=0, plaintext=True, payload_encoding="int8")


def test_cuda_status_says_why_device_tensors_are_staged():
    status = dlcp.cuda_status()
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present here")
    # No device here: the reason names the build or the runtime's answer.
    assert status is not None and ("CUDA" in status or "cuda" in status)


def test_broadcast_replaces_with_roots_data(aggregators):
    clients = connect_all(aggregators, "bcast", 3, loss_bound=0.01)
    try:
        bufs = [np.full(30_000, float(r + 1), dtype=np.float32) for r in range(3)]
        handles = [c.broadcast_async(3, b, root=2) for c, b in zip(clients, bufs)]
        for h in handles:
            h.wait(30)
        for b in bufs:
            assert np.all(b == 3.0)
    finally:
        for c in clients:
            c.close()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_callback_runs_on_the_clients_thread_and_may_fail_harmlessly(aggregators):
    clients = connect_all(aggregators, "callback", 2, loss_bound=0)
    try:
        seen = []
        done = threading.Event()

        def callback(stats, error):
            seen.append((threading.get_ident(), stats, error))
            done.set()
            raise ValueError("a broken callback must not take the client down")

        a, b = np.ones(100, np.float32), np.ones(100, np.float32)
        h = clients[0].allreduce_async(1, a, callback=callback)
        clients[1].allreduce(1, b, timeout=30)
        assert done.wait(30)
        h.wait(30)
        ident, stats, error = seen[0]
        assert ident != threading.get_ident() and error is None and stats["key"] == 1
        assert np.all(a == 2)
        # The client still works after the callback raised.
        h = clients[0].allreduce_async(1, a)
        clients[1].allreduce(1, b, timeout=30)
        h.wait(30)
        assert np.all(a == 4)
    finally:
        for c in clients:
            c.close()


def test_errors_carry_the_reason(aggregators):
    # A bad value is an InvalidArgumentError, which is a dlcp.Error and a ValueError both; a bad
    # type is a TypeError.
    (client,) = connect_all(aggregators, "errors", 1, loss_bound=0)
    with pytest.raises(TypeError, match="float32, not buffer format 'B'"):
        client.allreduce(1, bytearray(16))
    for name, bad in (("key", -1), ("layer", -2), ("key", 1 << 32)):
        with pytest.raises(ValueError, match=f"{name} must be in \\[0, 4294967296\\), not {bad}"):
            client.allreduce(**{"key": 1, "tensor": np.zeros(4, dtype=np.float32), name: bad})
    with pytest.raises(TypeError, match="key must be an int, not str"):
        client.allreduce("1", np.zeros(4, dtype=np.float32))
    with pytest.raises(ValueError, match="loss_bound must be in \\[0, 1\\), not 1.5"):
        client.allreduce(1, np.zeros(4, dtype=np.float32), loss_bound=1.5)
    with pytest.raises(ValueError, match="root must be in \\[0, 1\\), not -1"):
        client.broadcast(1, np.zeros(4, dtype=np.float32), root=-1)
    with pytest.raises(ValueError, match="contiguous"):
        client.allreduce(1, np.zeros((4, 4), dtype=np.float32)[:, :2])
    with pytest.raises(dlcp.InvalidArgumentError, match="empty"):
        client.allreduce(1, np.zeros(0, dtype=np.float32))
    with pytest.raises(dlcp.InvalidArgumentError, match="writable"):
        ro = np.zeros(4, dtype=np.float32)
        ro.flags.writeable = False
        client.allreduce(1, ro)
    with pytest.raises(ValueError, match="root must be in \\[0, 1\\), not 5"):
        client.broadcast(1, np.zeros(4, dtype=np.float32), root=5)
    with pytest.raises(dlcp.InvalidArgumentError, match="empty") as e:
        client.allreduce(1, np.zeros(0, dtype=np.float32))
    assert isinstance(e.value, ValueError) and e.value.code == "INVALID_ARGUMENT"
    client.close()
    client.close()  # idempotent
    with pytest.raises(dlcp.FailedPreconditionError, match="closed") as e:
        client.allreduce(1, np.zeros(4, dtype=np.float32))
    assert e.value.code == "FAILED_PRECONDITION" and not isinstance(e.value, ValueError)


def test_each_status_code_has_its_class():
    assert issubclass(dlcp.Error, RuntimeError)
    names = {cls.code: cls.__name__ for cls in dlcp.errors.BY_NUMBER.values()}
    assert len(names) == 16 and names["ABORTED"] == "AbortedError" and names["UNAVAILABLE"] == "UnavailableError"
    for cls in dlcp.errors.BY_NUMBER.values():
        assert issubclass(cls, dlcp.Error) and getattr(dlcp, cls.__name__) is cls
    # Text from a callback's error gives its code's class, the prefix before it.
    e = dlcp.errors.from_text("ABORTED: job 'j': worker rank 2 left", "bucket 0: ")
    assert type(e) is dlcp.AbortedError and str(e) == "bucket 0: ABORTED: job 'j': worker rank 2 left"
    assert type(dlcp.errors.from_text("something else")) is dlcp.Error
    with pytest.raises(dlcp.InvalidArgumentError, match="not host:port"):
        dlcp.resolve_aggregators("nohostport")


def _own_udp_ports():
    """The ports of this process's UDP sockets bound to 127.0.0.1 or to any address (from /proc)."""
    import os
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    ports = []
    with open("/proc/net/udp") as f:
        next(f)
        for line in f:
            fields = line.split()
            addr, inode = fields[1], fields[9]
            if inode in inodes and addr.split(":")[0] in ("0100007F", "00000000"):
                ports.append(int(addr.split(":")[1], 16))
    return ports


def test_rejects_counts_what_each_client_dropped_by_reason(aggregators):
    import socket
    clients = connect_all(aggregators, "rejects", 2, loss_bound=0)
    try:
        assert all("truncated" not in c.rejects() for c in clients)
        # Three bytes to every socket of this process: each client reads one of its own (the
        # others only send), so each counts exactly one truncated datagram.
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for port in _own_udp_ports():
                s.sendto(b"abc", ("127.0.0.1", port))
        bufs = [np.ones(1000, dtype=np.float32) for _ in clients]
        for h in [c.allreduce_async(1, b) for c, b in zip(clients, bufs)]:
            h.wait(30)
        assert all((b == 2).all() for b in bufs)
        for c in clients:
            rejects = c.rejects()
            assert rejects.get("truncated") == 1, rejects
            assert all(isinstance(k, str) and isinstance(v, int) and v > 0 for k, v in rejects.items())
            # What the kernel dropped for a full buffer is counted apart: nothing, for 4 KB of
            # results into a buffer of megabytes.
            assert c.rx_overflows() == 0
            assert c.rx_queue_ran_dry() == 0  # an RDMA count: 0 over UDP
            assert c.port_counters() == {}  # an RDMA NIC port's: none over UDP
    finally:
        for c in clients:
            c.close()
    assert clients[0].rejects().get("truncated") == 1  # still there to read once the client is closed
    assert clients[0].rx_overflows() == 0
    assert clients[0].rx_queue_ran_dry() == 0
    assert clients[0].port_counters() == {}


def test_pending_op_fails_on_close_and_timeout(aggregators):
    # Rank 0 of a two-worker job whose rank 1 never comes.
    client = dlcp.Client(aggregators=aggregators, job="pending", world_size=2, rank=0, plaintext=True, loss_bound=0,
                         op_timeout_ms=1000)
    h = client.allreduce_async(1, np.zeros(4, dtype=np.float32))
    with pytest.raises(dlcp.DeadlineExceededError, match="DEADLINE_EXCEEDED: dlcp op still running"):
        h.wait(0.1)
    with pytest.raises(dlcp.DeadlineExceededError, match="are all workers of the job running"):
        h.wait(10)  # rank 1 never came: the op deadline fails it
    h = client.allreduce_async(2, np.zeros(4, dtype=np.float32))
    client.close()
    with pytest.raises(dlcp.CancelledError, match="CANCELLED: dlcp client closed"):
        h.wait(10)


def test_bad_options_and_unreachable_aggregators():
    with pytest.raises(TypeError, match="unknown option 'bogus'"):
        dlcp.Client(aggregators="127.0.0.1:1", world_size=1, rank=0, plaintext=True, bogus=1)
    with pytest.raises(TypeError, match="option window_bytes takes an int, not a dict"):
        dlcp.Client(aggregators="127.0.0.1:1", world_size=1, rank=0, plaintext=True, window_bytes={})
    with pytest.raises(TypeError, match="option rank takes an int, not a str"):
        dlcp.Client(aggregators="127.0.0.1:1", world_size=2, rank="1", plaintext=True)
    with pytest.raises(TypeError, match="option plaintext takes a bool, not an int"):
        dlcp.Client(aggregators="127.0.0.1:1", world_size=2, rank=1, plaintext=1)
    with pytest.raises(ValueError, match="invalid value '-1' for option rank"):
        dlcp.Client(aggregators="127.0.0.1:1", world_size=2, rank=-1, plaintext=True)
    # world_size and rank are required: no silent world of one.
    with pytest.raises(TypeError, match="missing required option\\(s\\) world_size: pass them as keywords or "
                                        "set DLCP_WORLD_SIZE"):
        dlcp.Client(aggregators="127.0.0.1:1", rank=0, plaintext=True)
    with pytest.raises(ValueError, match=r"'2' for option loss_bound \(keyword argument\): must be in \[0, 1\]"):
        dlcp.Client(aggregators="127.0.0.1:1", world_size=1, rank=0, plaintext=True, loss_bound=2)
    with pytest.raises(ValueError, match="pull mode 'sometimes'"):
        dlcp.Client(aggregators="127.0.0.1:1", world_size=1, rank=0, plaintext=True, pull_mode="sometimes")
    with pytest.raises(ValueError, match="on_aggregator_loss 'retry' is not 'fail' or 'remap'"):
        dlcp.Client(aggregators="127.0.0.1:1", world_size=1, rank=0, plaintext=True, on_aggregator_loss="retry")
    with pytest.raises(dlcp.Error, match="rank 3 is not below world_size 2"):
        dlcp.Client(aggregators="127.0.0.1:1", world_size=2, rank=3, plaintext=True)
    with pytest.raises(dlcp.Error, match="UNAVAILABLE.*127.0.0.1:1"):
        dlcp.Client(aggregators="127.0.0.1:1", job="unreachable", world_size=1, rank=0, plaintext=True,
                    rpc_timeout_ms=1000)


def test_options_come_from_keywords_then_environment_then_defaults(monkeypatch):
    """DLCP_* variables fill what the keywords leave out, as they do for the binaries' flags."""
    monkeypatch.setenv("DLCP_LOSS_BOUND", "7")  # out of range: the error names where it came from
    with pytest.raises(ValueError, match="loss_bound \\(environment variable DLCP_LOSS_BOUND\\)"):
        dlcp.Client(aggregators="127.0.0.1:1", world_size=1, rank=0, plaintext=True)
    # A keyword wins over the environment: the valid keyword is taken, and the client gets as far
    # as dialling the aggregator.
    monkeypatch.setenv("DLCP_RPC_TIMEOUT_MS", "1000")
    with pytest.raises(dlcp.Error, match="UNAVAILABLE.*127.0.0.1:1"):
        dlcp.Client(aggregators="127.0.0.1:1", job="options", world_size=1, rank=0, plaintext=True, loss_bound=0)
    monkeypatch.setenv("DLCP_AGGREGATORS", "127.0.0.1:1")
    monkeypatch.setenv("DLCP_PLAINTEXT", "true")
    monkeypatch.setenv("DLCP_LOSS_BOUND", "0")
    monkeypatch.setenv("DLCP_JOB", "options")
    with pytest.raises(dlcp.Error, match="UNAVAILABLE.*127.0.0.1:1"):
        dlcp.Client(world_size=1, rank=0)


def test_a_job_is_named_or_comes_from_the_launcher(aggregators, monkeypatch):
    """Two runs that fell back to one fixed name would be summed together: without a name and
    without a launcher to derive one from, the client refuses, saying how to name the job."""
    for var in ("DLCP_JOB", "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(dlcp.Error, match="INVALID_ARGUMENT: no job name: set job \\(DLCP_JOB"):
        dlcp.Client(aggregators=aggregators, world_size=1, rank=0, plaintext=True)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun without --rdzv_id: not a name
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29511")
    client = dlcp.Client(aggregators=aggregators, world_size=1, rank=0, plaintext=True)
    try:
        assert client.job == "torch-127.0.0.1:29511"
    finally:
        client.close()


def test_the_log_level_comes_from_the_environment_or_a_call():
    """DLCP_LOG_LEVEL applies at import, as for the binaries; a bad one names the variable."""
    import subprocess
    import sys
    env = dict(os.environ, DLCP_LOG_LEVEL="loud")
    bad = subprocess.run([sys.executable, "-c", "import dlcp"], env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0
    assert "DLCP_LOG_LEVEL: unknown log level 'loud'" in bad.stderr
    # Choosing a transport logs at info; at DLCP_LOG_LEVEL=error that line is gone.
    connect = ("import dlcp\ntry:\n dlcp.Client(aggregators='127.0.0.1:1', job='log', world_size=1, rank=0, plaintext=True,"
               " rpc_timeout_ms=300)\nexcept dlcp.Error:\n print('refused')")
    for level, logged in (("info", True), ("error", False)):
        env["DLCP_LOG_LEVEL"] = level
        run = subprocess.run([sys.executable, "-c", connect], env=env, capture_output=True, text=True, timeout=60)
        assert run.stdout.strip() == "refused", run.stderr
        assert ("transport auto: using UDP" in run.stderr) == logged, (level, run.stderr)
    import logging
    dlcp.set_log_level(logging.DEBUG)
    assert logging.getLogger("dlcp").level == logging.DEBUG and dlcp._dlcp.log_level() == "debug"
    dlcp.set_log_level("info")
    assert logging.getLogger("dlcp").level == logging.INFO and dlcp._dlcp.log_level() == "info"
    with pytest.raises(ValueError, match="unknown log level 'chatty'"):
        dlcp.set_log_level("chatty")
    with pytest.raises(TypeError, match="not float"):
        dlcp.set_log_level(1.5)


LOGGING_PROBE = """
import logging, sys, time, dlcp
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record)
logging.getLogger("dlcp").addHandler(Keep())
logging.getLogger("dlcp").setLevel(sys.argv[1])
try:
    dlcp.Client(aggregators="127.0.0.1:1", job="log", world_size=1, rank=0, plaintext=True, rpc_timeout_ms=300)
except dlcp.UnavailableError:
    pass
deadline = time.monotonic() + 10
while sys.argv[1] == "INFO" and not any("transport auto" in r.getMessage() for r in records):
    assert time.monotonic() < deadline, "no transport line reached the logger"
    time.sleep(0.05)
print(dlcp._dlcp.log_level())
for r in records:
    print(r.levelname, r.filename, r.lineno, r.getMessage())
"""


def test_the_librarys_lines_go_through_pythons_logging_at_the_loggers_level():
    """With a handler on the "dlcp" logger, the C++ library's lines become records of it (with the
    C++ source file and line), not stderr lines; the logger's level sets the library's."""
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "DLCP_LOG_LEVEL"}
    for level in ("INFO", "WARNING"):
        run = subprocess.run([sys.executable, "-c", LOGGING_PROBE, level], env=env, capture_output=True, text=True,
                             timeout=60)
        assert run.returncode == 0, run.stderr
        lines = run.stdout.splitlines()
        assert lines[0] == level.lower()
        transport = [line for line in lines[1:] if "transport auto: using UDP" in line]
        if level == "INFO":
            assert transport and transport[0].startswith("INFO factory.cc "), lines
        else:
            assert not transport, lines
        assert "transport auto" not in run.stderr, run.stderr


def _stub_options():
    """The option lines of dlcp/__init__.pyi, from the option table."""
    lines = []
    for p in list(inspect.signature(dlcp.Client).parameters.values()):
        default = "" if p.default is inspect.Parameter.empty else f" = {p.default!r}"
        lines.append(f"        {p.name}: {p.annotation.__name__}{default},")
    return lines


def test_the_type_stub_declares_every_option_and_the_package_is_typed():
    """dlcp/__init__.pyi's Client options are the option table's (DLCP_UPDATE_DOCS=1 rewrites
    them in the source tree); py.typed ships beside it."""
    source = pathlib.Path(__file__).resolve().parents[2] / "client/python/dlcp/__init__.pyi"
    text = source.read_text()
    head, rest = text.split("        # BEGIN OPTIONS\n")
    block, tail = rest.split("        # END OPTIONS\n")
    want = "\n".join(_stub_options()) + "\n"
    if os.environ.get("DLCP_UPDATE_DOCS") == "1":
        source.write_text(head + "        # BEGIN OPTIONS\n" + want + "        # END OPTIONS\n" + tail)
        block = want
    assert block == want, "client/python/dlcp/__init__.pyi is behind the option table: rerun with DLCP_UPDATE_DOCS=1"
    installed = pathlib.Path(dlcp.__file__).parent
    for name in ("py.typed", "__init__.pyi", "torch.pyi"):
        assert (installed / name).exists(), name


def test_every_public_callable_has_a_docstring():
    import dlcp.torch
    for module in (dlcp, dlcp.torch):
        for name in module.__all__:
            obj = getattr(module, name)
            if not callable(obj):
                continue
            assert obj.__doc__, f"{module.__name__}.{name}"
            members = [m for m, v in vars(obj).items() if callable(v) or isinstance(v, property)] \
                if isinstance(obj, type) else []
            for member in members:
                if not member.startswith("_") or member == "__init__":
                    assert getattr(obj, member).__doc__, f"{module.__name__}.{name}.{member}"


def test_every_option_is_a_keyword_with_its_help():
    """The option table is the one declaration: each option is documented on dlcp.Client."""
    table = dlcp._dlcp.client_options()
    assert len(table) >= 40
    for row in table:
        assert row["env"] == "DLCP_" + row["name"].upper()
        assert f"\n      {row['name']}" in dlcp.Client.__doc__, row["name"]


def test_a_job_runs_over_ipv6(tmp_path):
    """Aggregators on ::1: the workers' data plane follows them to IPv6 with no setting."""
    from conftest import has_ipv6_loopback, start_aggregators, stop
    if not has_ipv6_loopback():
        pytest.skip("this host cannot bind ::1 (IPv6 is off)")
    procs, addrs = start_aggregators(tmp_path, 2, extra=("--inject-drop=0.05",), host="::1")
    try:
        assert addrs.startswith("[::1]:")
        clients = connect_all(addrs, "py-ipv6", 3, loss_bound=0)
        data = [np.arange(100_003, dtype=np.float32) * (r + 1) for r in range(3)]
        handles = [c.allreduce_async(0, d) for c, d in zip(clients, data)]
        for h in handles:
            h.wait()
        for d in data:
            np.testing.assert_array_equal(d, np.arange(100_003, dtype=np.float32) * 6)
        for c in clients:
            c.close()
    finally:
        stop(procs)


def test_resolve_aggregators_lists_every_address_sorted():
    assert dlcp.resolve_aggregators("localhost:7400") == "127.0.0.1:7400"
    # A name with no IPv4 address gives its IPv6 ones, bracketed.
    assert dlcp.resolve_aggregators("[::1]:7400") == "[::1]:7400"
    with pytest.raises(dlcp.Error, match="is not host:port"):
        dlcp.resolve_aggregators("dlcpd.dlcp.svc")
    with pytest.raises(dlcp.Error, match="UNAVAILABLE: cannot resolve"):
        dlcp.resolve_aggregators("no-such-host.invalid:7400")


def test_an_op_waiting_for_its_tensors_stream_is_submitted_once_it_is_ready(aggregators):
    """The path of CUDA tensors whose stream is still busy, with the event's wait played by a
    threading.Event (no GPU here): the handle returns at once, is not done while the tensor is
    not ready, a timed wait names what it waits for, and once ready the op sums as any other. A
    submission that fails fails the op and reaches its callback."""
    (client,) = connect_all(aggregators, "deferred", 1, loss_bound=0)
    try:
        ready = threading.Event()
        x = np.full(1000, 3.0, dtype=np.float32)
        op = client._submitter().submit(lambda: ready.wait(30), lambda: client._inner.submit(5, x))
        handle = dlcp.Handle(op)
        assert not handle.done()
        with pytest.raises(dlcp.DeadlineExceededError, match="waiting for its tensor's stream after 0.2 s"):
            handle.wait(0.2)
        ready.set()
        stats = handle.wait(30)
        assert stats["key"] == 5 and handle.done() and np.all(x == 3.0)
        seen = []

        def refuse():
            raise dlcp.FailedPreconditionError("FAILED_PRECONDITION: dlcp client is closed")

        failed = dlcp.Handle(client._submitter().submit(lambda: None, refuse, lambda s, e: seen.append(e)))
        with pytest.raises(dlcp.FailedPreconditionError, match="closed"):
            failed.wait(30)
        assert seen == ["FAILED_PRECONDITION: dlcp client is closed"]
    finally:
        client.close()
    assert client._deferred is None  # close() ended the submit thread


def test_a_cuda_tensor_whose_stream_never_finishes_fails_at_the_op_timeout(aggregators):
    """The submitter's wait for a CUDA tensor's event has the op's deadline (events played by
    objects with a query(); no GPU here): an event that never completes fails the op at the
    client's op timeout, naming the key, and one that completes after a while lets it through."""
    (client,) = connect_all(aggregators, "never-ready", 1, loss_bound=0, op_timeout_ms=500)

    class Event:
        def __init__(self, ready_after):
            self.looks, self.ready_after = 0, ready_after

        def query(self):
            self.looks += 1
            return self.looks > self.ready_after

    try:
        assert client._inner.op_timeout_s == 0.5
        x = np.full(10, 1.0, dtype=np.float32)
        start = time.monotonic()
        never = dlcp.Handle(client._submitter().submit(dlcp._ready_within(Event(10 ** 9), 0.5, 7),
                                                      lambda: client._inner.submit(7, x)))
        with pytest.raises(dlcp.DeadlineExceededError,
                           match=r"key 7's CUDA tensor was not ready within the op timeout \(0.5 s\)"):
            never.wait()
        assert 0.45 < time.monotonic() - start < 10
        soon = Event(20)
        stats = dlcp.Handle(client._submitter().submit(dlcp._ready_within(soon, 0.5, 8),
                                                       lambda: client._inner.submit(8, x))).wait()
        assert stats["key"] == 8 and soon.looks == 21
    finally:
        client.close()


def test_workers_of_a_host_sum_through_its_host_stage(two_hosts):
    """Ranks 0-1 share host A's stage and ranks 2-3 host B's (docs/host-stage.md): sums and a
    broadcast from another host are exact, every worker counts all four contributors, and an op
    under a loss bound goes through the stages too, pushed by each stage's first worker, with
    every worker reporting the bound it ran under."""
    aggregators, sockets = two_hosts
    clients = connect_all(aggregators, "host-stage", 4, local_size=2,
                          rank_options=lambda rank: {"host_socket": sockets[rank // 2]})
    try:
        for r, c in enumerate(clients):
            stage = c.host_stage
            assert stage.formed and stage.ranks == [r // 2 * 2, r // 2 * 2 + 1] and stage.why_not == "", stage
            assert (c.local_rank, c.local_size) == (r % 2, 2)
            assert stage.pushes == (r % 2 == 0) and not stage.whole_job
        inputs = [np.arange(50_000, dtype=np.float32) * (r + 1) for r in range(4)]
        bufs = [x.copy() for x in inputs]
        stats = [h.wait(30) for h in [c.allreduce_async(1, b) for c, b in zip(clients, bufs)]]
        for b in bufs:
            assert np.array_equal(b, np.arange(50_000, dtype=np.float32) * 10)
        assert all(s["min_contributors"] == 4 for s in stats)
        root = np.array([1.5, -2.25, 7e-30, 3.5], dtype=np.float32)
        bufs = [root.copy() if r == 3 else np.ones(4, dtype=np.float32) for r in range(4)]
        for h in [c.broadcast_async(2, b, root=3) for c, b in zip(clients, bufs)]:
            h.wait(30)
        for b in bufs:
            assert b.tobytes() == root.tobytes()
        bufs = [np.full(1000, 1.0, dtype=np.float32) for _ in range(4)]
        stats = [h.wait(30) for h in [c.allreduce_async(3, b, loss_bound=0.01) for c, b in zip(clients, bufs)]]
        for b in bufs:
            assert np.all(b == 4.0)
        assert [s["bytes_sent"] > 0 for s in stats] == [True, False, True, False]
        assert all(s["loss_bound"] == 0.01 and s["bound_violations"] == 0 for s in stats)
    finally:
        for c in clients:
            c.close()


def test_bounded_ops_larger_than_a_slot_go_through_the_stage_in_steps(two_hosts_small_slots):
    """Under a loss bound as without one, an op larger than a slot (64 KiB here) goes through the
    host stage in steps around one round of the whole tensor, with one manifest: only each
    stage's first worker sends bytes, every worker reports the op's ε, and with nothing lost the
    sums are exact. One key takes ops of either kind and size in turn."""
    aggregators, sockets = two_hosts_small_slots
    clients = connect_all(aggregators, "bounded-steps", 4, local_size=2, op_timeout_ms=20_000,
                          rank_options=lambda rank: {"host_socket": sockets[rank // 2]})
    try:
        for n, bound in ((40_000, 0.01), (1_000, 0.01), (40_000, 0.0), (40_000, 0.01)):
            bufs = [np.full(n, float(r + 1), dtype=np.float32) for r in range(4)]
            stats = [h.wait(30) for h in [c.allreduce_async(4, b, loss_bound=bound) for c, b in zip(clients, bufs)]]
            for b in bufs:
                assert np.all(b == 10.0), (n, bound)
            for rank, s in enumerate(stats):
                assert (s["bytes_sent"] > 0) == (rank % 2 == 0), (n, bound, rank, s["bytes_sent"])
                assert s["loss_bound"] == pytest.approx(bound), (n, bound, rank)
            if bound > 0:  # the members report the losses of their first worker's rounds, all steps of them
                assert sum(stats[0]["chunks_by_class"]) >= n * 4 // 65536, n
                assert stats[1]["chunks_by_class"] == stats[0]["chunks_by_class"], n
                assert stats[3]["chunks_by_class"] == stats[2]["chunks_by_class"], n
    finally:
        for c in clients:
            c.close()


def test_phase_aware_bounds_go_through_the_stage_and_every_worker_reports_them(two_hosts_small_slots):
    """With phase_aware, the stage's first worker sets the round's ε from the norm of the host's
    sum: critical for the first rounds (the configured ε), raised once the norm holds still. Every
    worker of the stage reports the ε its round ran under."""
    aggregators, sockets = two_hosts_small_slots
    clients = connect_all(aggregators, "phase-aware-stage", 4, local_size=2, op_timeout_ms=20_000, phase_aware=True,
                          rank_options=lambda rank: {"host_socket": sockets[rank // 2]})
    try:
        seen = []
        for _ in range(8):  # critical for 5 rounds after the first, then relaxed to 2 x ε
            bufs = [np.full(40_000, float(r + 1), dtype=np.float32) for r in range(4)]
            stats = [h.wait(30) for h in [c.allreduce_async(6, b, loss_bound=0.01) for c, b in zip(clients, bufs)]]
            for b in bufs:
                assert np.all(b == 10.0)
            assert stats[1]["bytes_sent"] == 0 and stats[3]["bytes_sent"] == 0
            assert {s["loss_bound"] for s in stats} == {stats[0]["loss_bound"]}, [s["loss_bound"] for s in stats]
            seen.append(stats[0]["loss_bound"])
        assert seen[0] == pytest.approx(0.01) and seen[-1] == pytest.approx(0.02), seen
    finally:
        for c in clients:
            c.close()


def test_a_worker_restarted_alone_forms_its_host_stage_again(two_hosts):
    """Rank 3 closes and comes back under its rank, alone (a pod restarted): rank 2, which lost its
    stage, asked dlcpd for the next one on standby, so rank 3's connect forms it at once, and once
    the job goes on both sum through it again, rank 3 sending nothing (docs/host-stage.md)."""
    aggregators, sockets = two_hosts
    options = dict(local_size=2, op_timeout_ms=20_000, loss_bound=0)

    def host(rank):
        return {"host_socket": sockets[rank // 2]}

    def until_through(clients):
        """Every rank runs key 1 until it goes through, as a trainer retries a failed step."""
        stats, errors = [None] * 4, []

        def run(rank):
            give_up = time.monotonic() + 60
            while time.monotonic() < give_up:
                buf = np.full(1000, float(rank + 1), dtype=np.float32)
                try:
                    stats[rank] = clients[rank].allreduce(1, buf, timeout=30)
                except dlcp.AbortedError:
                    time.sleep(0.05)  # until every rank is back
                    continue
                if not np.all(buf == 10.0):
                    errors.append(f"rank {rank}: {buf[:4]}")
                return
            errors.append(f"rank {rank} never got through")

        threads = [threading.Thread(target=run, args=(r,)) for r in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        return stats

    clients = connect_all(aggregators, "restart-alone", 4, rank_options=host, **options)
    try:
        stats = until_through(clients)
        assert stats[1]["bytes_sent"] == 0 and stats[3]["bytes_sent"] == 0
        clients[3].close()
        with pytest.raises(dlcp.AbortedError, match="worker rank 3 of this host's stage is gone"):
            clients[2].allreduce(1, np.ones(1000, dtype=np.float32), timeout=30)
        started = time.monotonic()
        clients[3] = dlcp.Client(aggregators=aggregators, job="restart-alone", world_size=4, rank=3, plaintext=True,
                                 **options, **host(3))
        assert time.monotonic() - started < 10, "rank 3 waited for its stage instead of completing it"
        stats = until_through(clients)
        assert stats[3]["bytes_sent"] == 0 and stats[2]["bytes_sent"] > 0, [s["bytes_sent"] for s in stats]
        assert stats[1]["bytes_sent"] == 0
    finally:
        for c in clients:
            c.close()


def test_a_whole_job_stage_reports_a_bounded_ops_classes_and_losses(two_hosts):
    """A stage that holds the whole job runs no network round: under a loss bound it still
    reports each chunk's class and the round's losses (none), and the sum is exact."""
    aggregators, sockets = two_hosts
    clients = connect_all(aggregators, "whole-job-bounded", 3, local_size=3, host_socket=sockets[0])
    try:
        assert all(c.host_stage.formed and c.host_stage.whole_job for c in clients)
        chunk_elems = 8192 // 4
        bufs = [np.arange(10 * chunk_elems, dtype=np.float32) * (r + 1) for r in range(3)]
        handles = [c.allreduce_async(4, b, loss_bound=0.05, report_classes=True) for c, b in zip(clients, bufs)]
        stats = [h.wait(30) for h in handles]
        for b in bufs:
            assert np.array_equal(b, np.arange(10 * chunk_elems, dtype=np.float32) * 6)
        for s in stats:
            assert len(s["classes"]) == 10 and sum(s["chunks_by_class"]) == 10, s
            assert s["classes"] == stats[0]["classes"]
            assert s["loss_bound"] == 0.05 and s["droppable_missing"] == 0 and s["bound_violations"] == 0
            assert s["droppable_total"] == 3 * (10 - s["chunks_by_class"][0])
    finally:
        for c in clients:
            c.close()


def test_a_worker_without_a_host_stage_says_why(two_hosts, tmp_path):
    """host_stage off, and a socket no dlcpd serves: the worker pushes its own data, and says why."""
    aggregators, _ = two_hosts
    clients = connect_all(aggregators, "no-stage", 2, local_size=2, host_socket=str(tmp_path / "none.sock"),
                          rank_options=lambda rank: {"host_stage": rank == 1})
    try:
        off, absent = clients[0].host_stage, clients[1].host_stage
        assert not off.formed and "host_stage is off" in off.why_not
        assert not absent.formed and "none.sock" in absent.why_not, absent
        assert (clients[1].local_size, off.ranks) == (2, [0])
        bufs = [np.ones(10, dtype=np.float32) for _ in range(2)]
        for h in [c.allreduce_async(1, b) for c, b in zip(clients, bufs)]:
            h.wait(30)
        assert all(np.all(b == 2.0) for b in bufs)
    finally:
        for c in clients:
            c.close()


def test_a_worker_that_closes_leaves_its_host_stage_and_the_others_say_so(two_hosts):
    """A stage of the whole job (docs/host-stage.md): once rank 1 closes its client, rank 0's
    next op fails at once, naming it, rather than at its deadline."""
    aggregators, sockets = two_hosts
    clients = connect_all(aggregators, "host-stage-close", 2, local_size=2, host_socket=sockets[0],
                          op_timeout_ms=30_000)
    try:
        bufs = [np.ones(100, dtype=np.float32) for _ in range(2)]
        for h in [c.allreduce_async(1, b) for c, b in zip(clients, bufs)]:
            h.wait(30)
        assert np.all(bufs[0] == 2.0)
        clients[1].close()
        started = time.monotonic()
        with pytest.raises(dlcp.AbortedError, match="worker rank 1 of this host's stage is gone"):
            clients[0].allreduce(1, np.ones(100, dtype=np.float32))
        assert time.monotonic() - started < 5
    finally:
        for c in clients:
            c.close()
