#!/usr/bin/env python3
"""The training demo: 4 workers learn the digits data set three ways in turn, on this machine
(dlcp with a loss bound and injected loss, dlcp reliable, DDP with Gloo), then print the final
accuracies and write a plot of accuracy against wall time. Run by scripts/demo.sh with the
aggregators it started; needs the build tree's python/ on PYTHONPATH."""
import argparse
import os
import multiprocessing as mp
import socket
import sys
import time

TTY = sys.stdout.isatty()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(run, rank, world, aggregators, epochs, gloo_init, queue):
    from dlcp.examples import digits
    try:
        def report(epoch, point):
            queue.put(("epoch", run["name"], rank, epoch, point))
        history = digits.train(run["mode"], rank, world, aggregators, epochs, loss_bound=run["loss_bound"],
                               inject_drop=run["inject_drop"], optimizer=run["optimizer"],
                               client_options={"plaintext": True, "transport": "udp"},
                               gloo_init=gloo_init, on_epoch=report, job=run["job"])
        queue.put(("done", run["name"], rank, history))
    except BaseException as e:  # the parent reports it; a worker never hangs the demo
        queue.put(("error", run["name"], rank, f"{type(e).__name__}: {e}"))


def bar(done, total, width=30):
    filled = int(width * done / total)
    return "[" + "#" * filled + "-" * (width - filled) + "]"


def run_one(run, world, aggregators, epochs, timeout):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=worker, args=(run, r, world, aggregators, epochs, init, queue)) for r in range(world)]
    for p in procs:
        p.start()
    histories, deadline = {}, time.monotonic() + timeout
    try:
        while len(histories) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"{run['name']}: workers did not finish within {timeout} s")
            try:
                kind, _, rank, *rest = queue.get(timeout=min(left, 5))
            except Exception:
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise RuntimeError(f"{run['name']}: a worker died") from None
                continue
            if kind == "error":
                raise RuntimeError(f"{run['name']}: worker {rank} failed: {rest[0]}")
            if kind == "epoch" and rank == 0:
                epoch, (secs, acc) = rest
                line = f"  {run['name']:<22} epoch {epoch + 1:>2}/{epochs} {bar(epoch + 1, epochs)} {acc:6.2f}%  {secs:6.1f} s"
                if TTY:  # one bar per run, redrawn each epoch
                    print(f"\r\033[K{line}", end="", flush=True)
                else:
                    print(line, flush=True)
            if kind == "done":
                histories[rank] = rest[0]
        if TTY:
            print()
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return histories[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--aggregators", required=True)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--loss-bound", type=float, default=0.05)
    ap.add_argument("--inject-drop", default="1:0.02,2:0.03,3:0.04")
    ap.add_argument("--optimizer", default="adam", choices=["sgd", "adam", "adamw"])
    ap.add_argument("--plot", default="dlcp-demo.png")
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args()
    runs = [
        dict(name=f"dlcp bounded (eps={a.loss_bound})", mode="dlcp", loss_bound=a.loss_bound, inject_drop=a.inject_drop),
        dict(name="dlcp reliable (eps=0)", mode="dlcp", loss_bound=0.0, inject_drop=""),
        dict(name="DDP + Gloo", mode="gloo", loss_bound=0.0, inject_drop=""),
    ]
    print(f"training a CNN on the digits data set: {a.workers} workers, {a.epochs} epochs per run; "
          f"bounded run drops {a.inject_drop} (class:fraction) of its packets")
    results = {}
    for i, run in enumerate(runs):
        run["optimizer"] = a.optimizer
        run["job"] = f"demo-{os.getpid()}-{i}"  # its own job: two demos at once must not meet
        results[run["name"]] = run_one(run, a.workers, a.aggregators, a.epochs, a.timeout)
    print(f"\n{'run':<24} {'final accuracy':>15} {'wall time':>10}")
    for name, history in results.items():
        print(f"{name:<24} {history[-1][1]:>14.2f}% {history[-1][0]:>9.1f}s")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name, history in results.items():
            ax.plot([0] + [t for t, _ in history], [10] + [acc for _, acc in history], marker="o", label=name)
        ax.set_xlabel("wall time (s)")
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(f"digits, {a.workers} workers on loopback")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(a.plot, dpi=100)
        print(f"\nplot: {a.plot}")
    except ImportError:
        print("\n(no matplotlib: plot skipped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
