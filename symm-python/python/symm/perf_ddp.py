"""``python -m symm.perf --ddp``: one DDP training step over torch.distributed's backend "symm"
and over "gloo", end to end, in one run.

Every rank holds the same model twice, one wrapped in ``DistributedDataParallel`` over a
``"symm"`` group of every rank (``dist.new_group(backend="symm")``: symm/c10d.py) and one over
the Gloo world, with DDP's defaults (25 MB buckets, the allreduce hook, gradients averaged).
The model is communication-heavy on purpose: an MLP of ``--ddp-layers`` square layers of
``--ddp-width`` features, run on ``--ddp-batch`` samples, so the gradients (4 bytes per
parameter) dwarf the arithmetic. A run times ``-n`` steps (forward, backward, SGD) after ``-w``
warm-up steps with each backend in turn; ``-r`` runs alternate them (symm, gloo, symm, ...) so
that noise hits one run of one backend.

Printed per backend: the step time (milliseconds, slowest rank; best run), and the share of it
that is communication left exposed, ``1 - compute / step``, where ``compute`` is the same step
of the bare model (no DDP, no communication) timed on the same ranks. Then ``symm/gloo``, the
gloo step time over symm's (above 1: symm faster), of the best runs and the median of the
ratios within each run, and whether both models ended with the same parameters (bit for bit on
2 ranks, where both sum each gradient of two ranks in the same order).
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
        opt.zero_grad(set_to_none=False)
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
    symm_group = dist.new_group(backend="symm")  # every rank: this starts symm too
    nets = {"symm": DDP(model(width, layers), process_group=symm_group), "gloo": DDP(model(width, layers))}
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
    params = [torch.cat([p.detach().flatten() for p in net.parameters()]) for net in nets.values()]
    # Steps are the same on both models (warm-up and timed, every run), so are their parameters.
    same = torch.tensor([int(torch.equal(params[0], params[1]))])
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    if rank == 0:
        report(runs, n, args, sum(p.numel() for p in bare.parameters()), bool(same.item()))
    dist.barrier()


def report(runs: List[Dict[str, float]], n: int, args: argparse.Namespace, numel: int, same: bool) -> None:
    best = {k: min(r[k] for r in runs) for k in runs[0]}
    out = sys.stdout
    out.write(
        f"# symm.perf --ddp: {n} ranks; MLP of {args.ddp_layers} x Linear({args.ddp_width}, {args.ddp_width}) "
        f"({numel / 1e6:.2f} M parameters, {4 * numel / 2**20:.1f} MiB of gradients per step), batch "
        f"{args.ddp_batch}; DDP defaults (25 MB buckets, allreduce hook); {args.iters} steps after "
        f"{args.warmup_iters} warm-up, {args.runs} runs (backends taking turns)\n"
        "# step(ms): forward + backward + SGD, slowest rank, best run; compute(ms): the same step of the bare "
        "model (no DDP); comm share: 1 - compute / step (communication left exposed)\n"
        f"#{'backend':>9} {'step(ms)':>10} {'compute(ms)':>12} {'comm share':>11}\n"
    )
    for name in ("symm", "gloo"):
        share = 1 - best["compute"] / best[name]
        out.write(f"{name:>10} {best[name] * 1e3:>10.2f} {best['compute'] * 1e3:>12.2f} {100 * share:>10.1f}%\n")
    paired = statistics.median(r["gloo"] / r["symm"] for r in runs)
    out.write(
        f"# symm/gloo (gloo step time / symm's, > 1: symm faster): {best['gloo'] / best['symm']:.2f} best runs, "
        f"{paired:.2f} median of the paired runs\n"
        f"# parameters after training, symm vs gloo: {'equal bit for bit' if same else 'differ'}\n"
    )
    out.flush()
