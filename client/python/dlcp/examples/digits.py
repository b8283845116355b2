"""Data-parallel training of a small CNN on scikit-learn's bundled digits (8x8 images, no
download), through dlcp or through DDP with Gloo, for the demo, the tests and the Kubernetes
trainer examples.

    python3 -m dlcp.examples.digits --mode=dlcp --rank=0 --world=4 --aggregators=h1:7070,h2:7070

Every option also reads DLCP_<NAME> from the environment (e.g. DLCP_RANK, DLCP_AGGREGATORS),
so a Kubernetes Job can set them per pod (deploy/k8s/examples/). Modes:
  dlcp      DistributedOptimizer (DeAR schedule) over dlcp; no process group needed
  dlcp-ddp  DistributedDataParallel with dlcp's comm hook (needs a Gloo group for DDP itself)
  gloo      DistributedDataParallel with Gloo's ring all-reduce (the baseline)
  local     each rank trains its shard alone, with no communication: the compute-only time of the
            same steps, for measuring what share of a step communication takes
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 32


def load(rank, world, seed=0):
    """(train inputs, train labels) of this rank's shard, and the whole test split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32).view(-1, 1, 8, 8) / 16.0
    y = torch.tensor(y, dtype=torch.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)
    per = len(xtr) // world  # equal shards: every worker runs the same number of steps
    return xtr[rank * per:(rank + 1) * per], ytr[rank * per:(rank + 1) * per], xte, yte


class Net(nn.Module):
    """Two convolutions and two linear layers: 38 k parameters by default. `hidden` widens the
    first linear layer (4096: 2.1 M parameters, 8.4 MB of gradients per step) so that
    communication, not compute, sets the pace, as in the congested-cluster benchmark."""

    def __init__(self, hidden=64):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 4 * 4, hidden)
        self.fc2 = nn.Linear(hidden, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def accuracy(model, x, y):
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item() * 100


def make_optimizer(name, params, lr):
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    raise ValueError(f"unknown optimizer {name!r}")


class _Clock:
    """Training time: wall time since start, less the time spent measuring accuracy."""

    def __init__(self):
        self.start, self.paused = time.perf_counter(), 0.0

    def measure(self, model, xte, yte):
        """(training seconds so far, test accuracy %), the measuring itself not counted."""
        t0 = time.perf_counter()
        elapsed = t0 - self.start - self.paused
        acc = accuracy(model, xte, yte)
        self.paused += time.perf_counter() - t0
        return (elapsed, acc)


def train(mode, rank, world, aggregators="", epochs=10, lr=None, optimizer="sgd", loss_bound=0.0, inject_drop="",
          client_options=None, gloo_init=None, seed=0, on_epoch=None, totals=None, hidden=64, job=None,
          batch=None, eval_every=0):
    """Trains and returns [(training seconds, test accuracy %)] after each epoch, and every
    `eval_every` steps as well when that is nonzero (the clock stops while accuracy is measured).
    In mode dlcp, `totals` (a dict) receives DistributedOptimizer.totals. `job`: the dlcp job's
    name, the same on every rank of this run and no other; None takes DLCP_JOB or the launcher's.
    `batch`: samples per worker and step (default 32)."""
    batch = batch or BATCH
    import dlcp
    import dlcp.torch
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    xtr, ytr, xte, yte = load(rank, world, seed)
    model = Net(hidden)
    lr = lr if lr is not None else (0.05 if optimizer == "sgd" else 2e-3)
    client = None
    if mode in ("gloo", "dlcp-ddp") and not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", init_method=gloo_init, rank=rank, world_size=world)
    if mode in ("dlcp", "dlcp-ddp"):
        opts = dict(aggregators=aggregators, job=job, world_size=world, rank=rank,
                    loss_bound=loss_bound, num_layers=dlcp.torch.num_layers(model))
        if inject_drop:
            opts.update(inject_drop_class=inject_drop, inject_seed=1000 + rank)
        opts.update(client_options or {})
        client = dlcp.Client(**opts)
    if mode == "dlcp":
        net = model
        opt = dlcp.torch.DistributedOptimizer(make_optimizer(optimizer, model.parameters(), lr), model, client)
    elif mode in ("gloo", "dlcp-ddp"):
        net = nn.parallel.DistributedDataParallel(model)
        if mode == "dlcp-ddp":
            net.register_comm_hook(None, dlcp.torch.comm_hook(client, model))
        opt = make_optimizer(optimizer, net.parameters(), lr)
    elif mode == "local":
        net = model
        opt = make_optimizer(optimizer, model.parameters(), lr)
    else:
        raise ValueError(f"unknown mode {mode!r}")
    history = []
    generator = torch.Generator().manual_seed(seed + 1)
    clock, steps = _Clock(), 0
    try:
        for epoch in range(epochs):
            order = torch.randperm(len(xtr), generator=generator)
            for i in range(0, len(order) - batch + 1, batch):
                idx = order[i:i + batch]
                opt.zero_grad()
                F.cross_entropy(net(xtr[idx]), ytr[idx]).backward()
                opt.step()
                steps += 1
                if eval_every and steps % eval_every == 0 and i + 2 * batch <= len(order):
                    if mode == "dlcp":
                        opt.synchronize()  # the parameters this step's all-reduce gives
                    history.append(clock.measure(model, xte, yte))
            if mode == "dlcp":
                opt.synchronize()
            history.append(clock.measure(model, xte, yte))
            if on_epoch is not None:
                on_epoch(epoch, history[-1])
        if mode == "dlcp" and totals is not None:
            totals.update(opt.totals)
    finally:
        if client is not None:
            client.close()
    return history


def main(argv=None):
    env = os.environ.get
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", default=env("DLCP_MODE", "dlcp"), choices=["dlcp", "dlcp-ddp", "gloo", "local"])
    # Rank: ours, then PyTorchJob's (RANK), then an Indexed Job's completion index.
    p.add_argument("--rank", type=int, default=int(env("DLCP_RANK", env("RANK", env("JOB_COMPLETION_INDEX", "0")))))
    p.add_argument("--world", type=int, default=int(env("DLCP_WORLD", env("WORLD_SIZE", "1"))))
    p.add_argument("--aggregators", default=env("DLCP_AGGREGATORS", ""))
    p.add_argument("--job", default=env("DLCP_JOB", None),
                   help="the dlcp job's name, the same on every rank of this run and no other; "
                        "default: the launcher's (TORCHELASTIC_RUN_ID, MASTER_ADDR:MASTER_PORT)")
    p.add_argument("--aggregators-service", default=env("DLCP_AGGREGATORS_SERVICE", ""),
                   help="host:port of a headless Service whose addresses are the aggregators (instead of --aggregators)")
    p.add_argument("--epochs", type=int, default=int(env("DLCP_EPOCHS", "10")))
    p.add_argument("--optimizer", default=env("DLCP_OPTIMIZER", "sgd"), choices=["sgd", "adam", "adamw"])
    p.add_argument("--loss-bound", type=float, default=float(env("DLCP_LOSS_BOUND", "0")))
    p.add_argument("--inject-drop", default=env("DLCP_INJECT_DROP", ""))
    p.add_argument("--plaintext", action="store_true", default=env("DLCP_PLAINTEXT", "") == "1")
    p.add_argument("--tls-ca", default=env("DLCP_TLS_CA", ""))
    p.add_argument("--tls-cert", default=env("DLCP_TLS_CERT", ""))
    p.add_argument("--tls-key", default=env("DLCP_TLS_KEY", ""))
    p.add_argument("--hidden", type=int, default=int(env("DLCP_HIDDEN", "64")), help="width of the first linear layer")
    p.add_argument("--batch", type=int, default=int(env("DLCP_BATCH", str(BATCH))), help="samples per worker and step")
    p.add_argument("--eval-every", type=int, default=int(env("DLCP_EVAL_EVERY", "0")),
                   help="measure test accuracy every this many steps too (0: after each epoch only)")
    p.add_argument("--data-host", default=env("DLCP_DATA_HOST", ""), help="address results are sent to")
    p.add_argument("--chunk-bytes", type=int, default=int(env("DLCP_CHUNK_BYTES", "0")),
                   help="payload bytes per datagram; 0 fits the transport (at most 8192)")
    p.add_argument("--transport", default=env("DLCP_TRANSPORT", "auto"), choices=("auto", "udp", "rdma"),
                   help="data plane; auto picks RDMA where a device is usable")
    p.add_argument("--window-bytes", type=int, default=int(env("DLCP_WINDOW_BYTES", str(4 << 20))))
    p.add_argument("--on-aggregator-loss", default=env("DLCP_ON_AGGREGATOR_LOSS", "fail"), choices=("fail", "remap"),
                   help="remap: a dead aggregator's share moves to the others and training goes on")
    p.add_argument("--json", action="store_true", help="print the history as one JSON line at the end")
    p.add_argument("--gloo-init", default=env("DLCP_GLOO_INIT", None),
                   help="init_method of the Gloo group (gloo and dlcp-ddp modes), e.g. tcp://host:port")
    a = p.parse_args(argv)
    if a.mode in ("dlcp", "dlcp-ddp") and not a.aggregators:
        if not a.aggregators_service:
            p.error("--aggregators or --aggregators-service (or DLCP_AGGREGATORS[_SERVICE]) is required")
        import dlcp
        a.aggregators = dlcp.resolve_aggregators(a.aggregators_service)
    tls = {k: v for k, v in (("tls_ca", a.tls_ca), ("tls_cert", a.tls_cert), ("tls_key", a.tls_key)) if v}
    tls["plaintext"] = a.plaintext
    options = dict(tls, chunk_bytes=a.chunk_bytes, window_bytes=a.window_bytes, transport=a.transport,
                   on_aggregator_loss=a.on_aggregator_loss)
    if a.data_host:
        options["data_host"] = a.data_host

    def report(epoch, point):
        if a.rank == 0:
            print(f"epoch {epoch + 1}/{a.epochs}: {point[1]:.2f}% after {point[0]:.1f} s", flush=True)

    history = train(a.mode, a.rank, a.world, a.aggregators, a.epochs, optimizer=a.optimizer, loss_bound=a.loss_bound,
                    inject_drop=a.inject_drop, client_options=options, gloo_init=a.gloo_init, on_epoch=report,
                    hidden=a.hidden, job=a.job, batch=a.batch, eval_every=a.eval_every)
    if a.rank == 0:
        print(f"final accuracy {history[-1][1]:.2f}%")
    if a.json:
        steps = a.epochs * (len(load(a.rank, a.world)[0]) // a.batch)
        print(json.dumps({"mode": a.mode, "rank": a.rank, "steps": steps, "history": history}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
