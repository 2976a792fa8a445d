"""``python -m symm.perf --ddp``: one DDP training step over torch.distributed's backend "symm"
and over "gloo", end to end, in one run.

Every rank holds the same model three times, wrapped in ``DistributedDataParallel`` over a
``"symm"`` group of every rank (``dist.new_group(backend="symm")``: symm/c10d.py) with DDP's
defaults (25 MB buckets, the allreduce hook, gradients averaged), over the same group with
symm's communication hook (``symm.ddp.allreduce_hook``: the buckets moved into symmetric memory,
zero-copy), and over the Gloo world with DDP's defaults. ``--ddp-bucket-view`` makes every model
keep its gradients in the buckets (``gradient_as_bucket_view=True``), which saves DDP a copy of
every gradient into and out of its buckets.
The model is communication-heavy on purpose: an MLP of ``--ddp-layers`` square layers of
``--ddp-width`` features, run on ``--ddp-batch`` samples, so the gradients (4 bytes per
parameter) dwarf the arithmetic. A run times ``-n`` steps (forward, backward, SGD) after ``-w``
warm-up steps with each way in turn; ``-r`` runs repeat the turn (symm, symm+hook, gloo, symm,
...) so that noise hits one run of one way.

Printed per way (``symm``, ``symm+hook``, ``gloo``): the step time (milliseconds, slowest rank;
best run), and the share of it that is communication left exposed, ``1 - compute / step``, where
``compute`` is the same step of the bare model (no DDP, no communication) timed on the same
ranks. Then, for each symm way, the gloo step time over its own (above 1: symm faster), of the
best runs and the median of the ratios within each run, and whether the models ended with the
same parameters as over Gloo (bit for bit on 2 ranks, where each gradient is the same two
numbers added and halved).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any, Dict, List


def model(width: int, layers: int) -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])


def timed_steps(net: Any, batch: int, width: int, rank: int, steps: int, warmup: int) -> float:
    """Seconds per step of ``steps`` training steps after ``warmup`` ones (each step's data is
    the rank's own, the same for every model)."""
    import torch

    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    inputs = [torch.randn(batch, width, generator=torch.Generator().manual_seed(100 * s + rank)) for s in range(2)]

    def step(i: int) -> None:
        opt.zero_grad()  # torch's default: set_to_none
        net(inputs[i % 2]).square().mean().backward()
        opt.step()

    for i in range(warmup):
        step(i)
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
    return (time.perf_counter() - t0) / steps


def ddp_main(rank: int, n: int, args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    width, layers, batch = args.ddp_width, args.ddp_layers, args.ddp_batch
    from .ddp import allreduce_hook

    symm_group = dist.new_group(backend="symm")  # every rank: this starts symm too
    view = {"gradient_as_bucket_view": args.ddp_bucket_view}
    hooked = DDP(model(width, layers), process_group=symm_group, **view)
    hooked.register_comm_hook(symm_group, allreduce_hook)
    nets = {
        "symm": DDP(model(width, layers), process_group=symm_group, **view),
        "symm+hook": hooked,
        "gloo": DDP(model(width, layers), **view),
    }
    bare = model(width, layers)

    def slowest(seconds: float) -> float:
        t = torch.tensor([seconds], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    runs: List[Dict[str, float]] = []
    for _ in range(args.runs):
        times = {}
        for name, net in nets.items():
            dist.barrier()
            times[name] = slowest(timed_steps(net, batch, width, rank, args.iters, args.warmup_iters))
        times["compute"] = slowest(timed_steps(bare, batch, width, rank, args.iters, args.warmup_iters))
        runs.append(times)
    params = {k: torch.cat([p.detach().flatten() for p in net.parameters()]) for k, net in nets.items()}
    # Steps are the same on every model (warm-up and timed, every run), so are their parameters.
    same = torch.tensor([int(torch.equal(params[k], params["gloo"])) for k in SYMM_WAYS])
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    if rank == 0:
        agree = {k: bool(v) for k, v in zip(SYMM_WAYS, same.tolist())}
        report(runs, n, args, sum(p.numel() for p in bare.parameters()), agree)
    dist.barrier()


#: The ways over symm, each compared with Gloo.
SYMM_WAYS = ("symm", "symm+hook")


def report(runs: List[Dict[str, float]], n: int, args: argparse.Namespace, numel: int, same: Dict[str, bool]) -> None:
    best = {k: min(r[k] for r in runs) for k in runs[0]}
    out = sys.stdout
    out.write(
        f"# symm.perf --ddp: {n} ranks; MLP of {args.ddp_layers} x Linear({args.ddp_width}, {args.ddp_width}) "
        f"({numel / 1e6:.2f} M parameters, {4 * numel / 2**20:.1f} MiB of gradients per step), batch "
        f"{args.ddp_batch}; DDP defaults (25 MB buckets{', gradient_as_bucket_view' if args.ddp_bucket_view else ''}); "
        f"symm+hook: symm.ddp.allreduce_hook; {args.iters} steps after "
        f"{args.warmup_iters} warm-up, {args.runs} runs (backends taking turns)\n"
        "# step(ms): forward + backward + SGD, slowest rank, best run; compute(ms): the same step of the bare "
        "model (no DDP); comm share: 1 - compute / step (communication left exposed)\n"
        f"#{'backend':>9} {'step(ms)':>10} {'compute(ms)':>12} {'comm share':>11}\n"
    )
    for name in (*SYMM_WAYS, "gloo"):
        share = 1 - best["compute"] / best[name]
        out.write(f"{name:>10} {best[name] * 1e3:>10.2f} {best['compute'] * 1e3:>12.2f} {100 * share:>10.1f}%\n")
    for name in SYMM_WAYS:
        paired = statistics.median(r["gloo"] / r[name] for r in runs)
        out.write(
            f"# {name}/gloo (gloo step time / {name}'s, > 1: symm faster): {best['gloo'] / best[name]:.2f} best "
            f"runs, {paired:.2f} median of the paired runs; parameters after training, {name} vs gloo: "
            f"{'equal bit for bit' if same[name] else 'differ'}\n"
        )
    out.flush()
