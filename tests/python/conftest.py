"""Fixtures for the Python binding tests: real dlcpd aggregators on loopback.

ctest sets DLCP_BUILD_DIR (for dlcpd) and runs the suites with the python of the venv that
Python.Install made (tests/python/venv_install.sh). By hand, PYTHONPATH=<build>/python does too."""
import json
import os
import pathlib
import subprocess
import time

import pytest

BUILD = pathlib.Path(os.environ.get("DLCP_BUILD_DIR", pathlib.Path(__file__).resolve().parents[2] / "build"))


def pytest_configure(config):
    """Under ctest, the suites must test the package pip installed, not the build tree's."""
    venv = os.environ.get("DLCP_EXPECT_INSTALLED")
    if venv:
        import dlcp
        assert pathlib.Path(dlcp.__file__).resolve().is_relative_to(pathlib.Path(venv).resolve()), \
            f"dlcp was imported from {dlcp.__file__}, not from the venv {venv}"


def start_aggregators(workdir, count, extra=(), host="127.0.0.1"):
    dlcpd = BUILD / "server" / "dlcpd"
    if not dlcpd.exists():
        pytest.fail(f"{dlcpd} is missing; build first")
    procs, addrs = [], []
    for i in range(count):
        ready = workdir / f"agg{i}.ready"
        log = open(workdir / f"agg{i}.log", "w")
        procs.append(subprocess.Popen([str(dlcpd), f"--host={host}", "--port=0", "--data-port=0", "--plaintext",
                                       "--log-level=warning", f"--ready-file={ready}",
                                       f"--host-socket={workdir / f'agg{i}.sock'}", *extra],
                                      stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 10
        while not (ready.exists() and ready.stat().st_size > 0):
            if time.monotonic() > deadline or procs[-1].poll() is not None:
                raise RuntimeError(f"dlcpd {i} did not start: {(workdir / f'agg{i}.log').read_text()}")
            time.sleep(0.02)
        bracketed = f"[{host}]" if ":" in host else host
        addrs.append(f"{bracketed}:{json.loads(ready.read_text())['control_port']}")
    return procs, ",".join(addrs)


def has_ipv6_loopback():
    import socket
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def stop(procs):
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


@pytest.fixture(scope="session")
def aggregators(tmp_path_factory):
    """Two aggregators shared by the session's tests (each test uses its own job names)."""
    procs, addrs = start_aggregators(tmp_path_factory.mktemp("dlcpd"), 2)
    yield addrs
    stop(procs)


def _hosts(tmp_path_factory, name, extra=()):
    work = tmp_path_factory.mktemp(name)
    procs, addrs = start_aggregators(work, 2, extra)
    return procs, (addrs, [str(work / "agg0.sock"), str(work / "agg1.sock")])


@pytest.fixture(scope="session")
def two_hosts(tmp_path_factory):
    """Two aggregators, each its host's dlcpd: their addresses, and each one's host socket
    (docs/host-stage.md)."""
    procs, hosts = _hosts(tmp_path_factory, "dlcpd-hosts")
    yield hosts
    stop(procs)


@pytest.fixture(scope="session")
def two_hosts_small_slots(tmp_path_factory):
    """two_hosts with 64 KiB slots: a tensor of over 16384 float32 values takes several steps."""
    procs, hosts = _hosts(tmp_path_factory, "dlcpd-small-slots", ["--host-slot-bytes=65536"])
    yield hosts
    stop(procs)
