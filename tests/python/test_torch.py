"""dlcp with PyTorch: DDP's comm hook and the DeAR-style DistributedOptimizer, in real
multi-process jobs against real aggregators."""
import multiprocessing as mp
import os
import queue as queue_lib
import socket
import subprocess
import sys
import textwrap
import time
import traceback

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

import dlcp  # noqa: E402
import torch_workers  # noqa: E402
from conftest import start_aggregators, stop  # noqa: E402


def _entry(fn, rank, args, results):
    try:
        results.put((rank, "ok", fn(rank, *args)))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))


def run_ranks(fn, world, *args, timeout=150):
    """Runs fn(rank, world, *args) in `world` spawned processes; returns {rank: result}. A rank
    that exits without a result shows up as {"exitcode": code}."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_entry, args=(fn, r, (world, *args), results)) for r in range(world)]
    for p in procs:
        p.start()
    out, deadline = {}, time.monotonic() + timeout
    try:
        while len(out) < world:
            try:
                rank, kind, value = results.get(timeout=1)
            except queue_lib.Empty:
                for r, p in enumerate(procs):
                    if r not in out and p.exitcode not in (None, 0):
                        out[r] = {"exitcode": p.exitcode}
                if time.monotonic() > deadline:
                    raise AssertionError(f"ranks {sorted(set(range(world)) - set(out))} gave no result in {timeout} s")
                continue
            if kind == "error":
                raise AssertionError(f"rank {rank} failed:\n{value}")
            out[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_under_a_launcher_rank_world_size_and_job_come_from_its_environment(aggregators, tmp_path):
    """Three workers started as torchrun starts them, with RANK, WORLD_SIZE and TORCHELASTIC_RUN_ID
    (and LOCAL_RANK, MASTER_ADDR, ...) in their environment, make their Clients with neither rank,
    world_size nor job: they must form one job and sum exactly. (torchrun itself cannot run here:
    Debian 12's torch 1.13 launcher fails on Python 3.11's IntFlag before it starts a worker.)"""
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent("""
        import sys
        import numpy as np
        import dlcp
        client = dlcp.Client(aggregators=sys.argv[1], plaintext=True, loss_bound=0)
        x = np.full(100003, client.rank + 1, dtype=np.float32)
        client.allreduce(0, x)
        print(f"rank {client.rank} of {client.world_size} in {client.job}: {x.min()} {x.max()}", flush=True)
        client.close()
    """))
    run_id = f"launched-{os.getpid()}-{free_port()}"
    world = 3
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500",
                   TORCHELASTIC_RUN_ID=run_id)
        procs.append(subprocess.Popen([sys.executable, str(script), aggregators], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=60)[0])
    finally:
        for p in procs:
            p.kill()
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, out
        assert f"rank {rank} of {world} in {run_id}: 6.0 6.0" in out, out


def test_launcher_settings_yield_to_given_ones_and_bad_ones_are_named():
    options = {"rank": 2}
    dlcp._launcher_defaults(options, {"RANK": "0", "WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "none"})
    assert options == {"rank": 2, "world_size": 4}  # "none": torchrun without --rdzv_id
    with pytest.raises(dlcp.Error, match="world_size: the launcher's WORLD_SIZE='four' is not a whole number"):
        dlcp._launcher_defaults({}, {"WORLD_SIZE": "four"})


def relative_error(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-12))


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_lossless_training_matches_ddp_with_gloo(aggregators, optimizer):
    world = 4
    out = run_ranks(torch_workers.parity, world, aggregators, f"tcp://127.0.0.1:{free_port()}", optimizer,
                    f"parity-{optimizer}")
    assert out[0]["groups"] > 1  # the pipeline really ran over several fusion groups
    for way in ("hook", "dear"):
        for r in range(world):
            err = relative_error(out[r][way], out[r]["gloo"])
            assert err <= 1e-5, f"{way} on rank {r}: {err:.3g} from DDP with Gloo"
            assert np.array_equal(out[r][way], out[0][way]), f"{way}: rank {r} differs from rank 0"
        assert relative_error(out[0][way], torch_workers._flat(torch_workers.digits.Net())) > 1e-3  # it trained


def test_lossless_training_through_host_stages_matches_ddp_with_gloo(two_hosts):
    """Ranks 0-1 and 2-3 share a host stage each (docs/host-stage.md): the comm hook's buckets and
    the optimizer's fusion groups, submitted from backward hooks, go through the stages in the same
    order on every rank, and train as DDP over Gloo does."""
    aggregators, sockets = two_hosts
    world = 4
    out = run_ranks(torch_workers.parity, world, aggregators, f"tcp://127.0.0.1:{free_port()}", "sgd",
                    "parity-host-stages", sockets)
    assert out[0]["groups"] > 1
    for r in range(world):  # through the stages, not a silent fallback
        stage = out[r]["host_stage"]
        assert stage["formed"] and stage["ranks"] == [r // 2 * 2, r // 2 * 2 + 1], stage
    for way in ("hook", "dear"):
        for r in range(world):
            err = relative_error(out[r][way], out[r]["gloo"])
            assert err <= 1e-5, f"{way} on rank {r}: {err:.3g} from DDP with Gloo"
            assert np.array_equal(out[r][way], out[0][way]), f"{way}: rank {r} differs from rank 0"


def test_bounded_loss_keeps_accuracy_within_a_point(aggregators):
    world, epochs = 4, 8
    lossless = run_ranks(torch_workers.accuracy, world, aggregators, 0.0, "", epochs)
    lossy = run_ranks(torch_workers.accuracy, world, aggregators, 0.05, "1:0.03,2:0.03,3:0.03", epochs)
    base, acc = lossless[0]["accuracy"], lossy[0]["accuracy"]
    assert base > 90, f"lossless training reached only {base:.2f}%"
    assert abs(acc - base) <= 1.0, f"ε=0.05 with loss: {acc:.2f}% vs lossless {base:.2f}%"
    assert all(lossy[r]["accuracy"] == acc for r in range(world))  # consistent pull: identical replicas
    # The loss was real, some of it was left out rather than repaired, and the bound held.
    assert all(lossy[r]["injected_drops"] > 0 for r in range(world))
    assert sum(lossy[r]["left_out"] for r in range(world)) > 0
    assert all(lossy[r]["bound_violations"] == 0 for r in range(world))
    missing = lossy[0]["droppable_missing"] / max(lossy[0]["droppable_total"], 1)
    assert 0 < missing <= 0.05
    assert all(lossless[r]["left_out"] == 0 and lossless[r]["droppable_missing"] == 0 for r in range(world))


@pytest.mark.parametrize("how,within_s", [("crash", 15), ("raise", 5)])
def test_a_failed_worker_fails_the_others_naming_its_rank(aggregators, how, within_s):
    # A crash is noticed at the heartbeat deadline (3 s); a worker that raises and closes its
    # client leaves, which fails the job at once.
    out = run_ranks(torch_workers.dies_mid_training, 3, aggregators, 2, 5, how)
    if how == "crash":
        assert out[2] == {"exitcode": 3}
    else:
        assert out[2]["error"] == "a bug in the trainer"
    for r in (0, 1):
        assert out[r]["error"] is not None, f"rank {r} did not notice"
        assert "rank 2" in out[r]["error"] and "ABORTED" in out[r]["error"], out[r]["error"]
        assert out[r]["after_s"] < within_s


def test_unreachable_aggregator_raises_at_construction():
    import dlcp
    with pytest.raises(dlcp.Error, match="UNAVAILABLE"):
        dlcp.Client(aggregators=f"127.0.0.1:{free_port()}", job="unreachable", world_size=2, rank=0,
                    plaintext=True, rpc_timeout_ms=1000)


def test_auto_fusion_agrees_across_workers(aggregators):
    world = 2
    out = run_ranks(torch_workers.auto_fusion, world, aggregators)
    assert out[0]["sizes"] == out[1]["sizes"]
    assert len(set(out[0]["sizes"])) > 1  # it tried more than one size
    assert np.array_equal(out[0]["params"], out[1]["params"])


def test_bounded_pull_replicas_resynchronise(tmp_path):
    # An aggregator that loses some of its result packets: replicas drift between broadcasts.
    procs, addrs = start_aggregators(tmp_path, 1, ["--inject-drop-class=1:0.05,2:0.05,3:0.05"])
    try:
        out = run_ranks(torch_workers.bounded_pull, 2, addrs, "")
    finally:
        stop(procs)
    assert np.array_equal(out[0], out[1])  # the last step broadcast rank 0's parameters


def test_fusion_tuner_finds_the_minimum():
    from dlcp.fusion import FusionTuner, MB
    tuner = FusionTuner(trials=10)
    best = 24 * MB
    while not tuner.finished:
        size = tuner.suggest_bytes()
        tuner.observe(1.0 + abs(np.log2(size / best)))  # iteration time, lowest at 24 MB
    assert 12 * MB <= tuner.best_bytes() <= 48 * MB
    with pytest.raises(ValueError):
        FusionTuner(low_mb=8, high_mb=4)


def test_accumulation_parameter_groups_frozen_and_unused_parameters_match_ddp(aggregators):
    """Two backward passes per step through backward_passes_per_step and through no_sync(), two
    parameter groups, a frozen and an unused parameter: DDP over Gloo's parameters within 1e-5."""
    world = 3
    out = run_ranks(torch_workers.accumulation, world, aggregators, f"tcp://127.0.0.1:{free_port()}", "accumulate")
    for r in range(world):
        for way in ("passes", "no_sync"):
            err = relative_error(out[r][way], out[r]["gloo"])
            assert err <= 1e-5, f"{way} on rank {r}: {err:.3g} from DDP with Gloo"
            assert np.array_equal(out[r]["frozen_" + way], out[r]["frozen_start"]), "a frozen parameter moved"
            assert np.array_equal(out[r]["unused_" + way], out[r]["unused_start"]), "an unused parameter moved"
            # One push per step, not per backward pass: the groups' rounds over STEPS / 2 steps.
            assert out[r]["rounds_" + way] % (torch_workers.STEPS // 2) == 0
        assert relative_error(out[r]["passes"], torch_workers._flat(torch_workers._Extended())) > 1e-3  # it trained


def test_amp_every_worker_skips_the_step_any_worker_overflowed(aggregators):
    """GradScaler.step(DistributedOptimizer): rank 2's gradients overflow at step 4. Every worker
    skips that step and halves its scale, as DDP over Gloo does, and the parameters match DDP's."""
    world, inf_rank, inf_step = 3, 2, 4
    out = run_ranks(torch_workers.amp_steps, world, aggregators, f"tcp://127.0.0.1:{free_port()}", "amp", inf_rank,
                    inf_step)
    for r in range(world):
        dear, gloo = out[r]["dear"], out[r]["gloo"]
        assert dear["skipped"] == 1 and gloo["skipped"] == 1, (r, dear["skipped"], gloo["skipped"])
        assert dear["scales"] == gloo["scales"] == out[0]["dear"]["scales"]
        assert dear["scales"][inf_step] == dear["scales"][inf_step - 1] / 2
        assert relative_error(dear["params"], gloo["params"]) <= 1e-5
        assert np.array_equal(dear["params"], out[0]["dear"]["params"])


def test_broadcasts_give_every_worker_roots_parameters_buffers_and_optimizer_state(aggregators):
    world = 3
    out = run_ranks(torch_workers.broadcasts, world, aggregators, "broadcasts")
    for r in range(world):
        assert out[r]["tracked"] == 7 + 1, "the integer buffer is root's"
        assert np.array_equal(out[r]["running_var"], out[1]["running_var"]), "the float64 buffer is root's, exactly"
        assert out[r]["adam_steps"] and all(s == 3 for s in out[r]["adam_steps"]), out[r]["adam_steps"]
        assert np.array_equal(out[r]["exp_avg"], out[1]["exp_avg"])
        assert np.array_equal(out[r]["params"], out[0]["params"])
        assert out[r]["state_steps"] == out[0]["state_steps"] and min(out[r]["state_steps"]) >= 3


def test_the_optimizer_names_what_it_cannot_take(aggregators):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2).double())
    client = dlcp.Client(aggregators=aggregators, job="refusals", world_size=1, rank=0, plaintext=True)
    try:
        with pytest.raises(TypeError, match="parameter 1.weight is float64 on cpu"):
            dlcp.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, client)
        other = torch.nn.Linear(2, 2)
        with pytest.raises(ValueError, match="a parameter the model does not have"):
            dlcp.torch.DistributedOptimizer(torch.optim.SGD(other.parameters(), lr=0.1), model[0], client)
        with pytest.raises(ValueError, match="backward_passes_per_step must be an int of at least 1"):
            dlcp.torch.DistributedOptimizer(torch.optim.SGD(model[0].parameters(), lr=0.1), model[0], client,
                                            backward_passes_per_step=0)
    finally:
        client.close()
    with pytest.raises(ValueError, match="0 dlcp clients are open in this process; pass client="):
        dlcp.torch.broadcast_parameters(model[0])


def _cuda_skip_reason():
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False); scripts/gpu-check.sh runs this on a GPU machine"
    return dlcp.cuda_status()  # None when the CUDA packer is usable


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_gpu_checks_training_ways_match_ddp_over_gloo(aggregators, device):
    """scripts/gpu_torch_check.py, the PyTorch part of the GPU check: DistributedOptimizer, the comm
    hook and accumulation (and on CUDA: AMP and a bfloat16 model) against DDP over Gloo, 2 workers.
    On the CPU it keeps the script working where no GPU is; on CUDA it is the device test."""
    if device == "cuda" and _cuda_skip_reason() is not None:
        pytest.skip(_cuda_skip_reason())
    import pathlib
    script = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "gpu_torch_check.py"
    run = subprocess.run([sys.executable, str(script), f"--aggregators={aggregators}", f"--device={device}",
                          "--workers=2", "--steps=10"], capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "dear against gloo" in run.stdout and "FAILED" not in run.stdout, run.stdout
