#!/usr/bin/env python3
"""Compares builds of the Python extension on a small allreduce, interleaved call for call.

Usage: scripts/py-ab.py [--ranks 1|2] [--op allreduce|broadcast|alltoall] [--grad on|off] [--rounds R]
                       [--calls N] DIR [DIR ...]

Each DIR holds one build, installed with `pip install --no-deps --target DIR ./symm-python`.
Every build gets its own long-lived workers (one per rank, each a `torch.distributed` gloo world
of `--ranks` ranks with `symm.init`, rank r pinned to CPU r); the coordinator then asks the
builds in turn, for R rounds (the order reversed every other round), to time N calls of
`symm.shmem_allreduce(t, "sum")` (or, with `--op broadcast`, `symm.shmem_broadcast(t, 0)`) on a
1-element float32 tensor (a symmetric tensor on 2 ranks), or with `--op alltoall`
`symm.shmem_alltoall(parts, recv, counts)` of 8 bytes per peer (views of a symmetric tensor, the
counts an int64 tensor, as HyperParallel passes them). A round's time is the slowest rank's.

`--grad off` runs the calls with grad mode off (`torch.set_grad_enabled(False)`; default on, as
in user code).

Printed per build: quantiles of the per-call time (ns), and the median over the rounds of the
ratio to the first build in the same round. The placement of a VM's vCPUs moves every few
minutes and changes every figure by up to 3x; builds measured in the same round see the same
placement, so the paired median resolves a few percent (two copies of one build: 0.996-0.997),
where separately started runs do not.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from functools import partial


def worker() -> None:
    """One rank of one build: reads `fast N` lines, prints ns per call."""
    import torch
    import torch.distributed as dist

    import symm
    from symm.perf import call_loop

    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    symm.init()
    os.sched_setaffinity(0, {rank % os.cpu_count()})
    n = dist.get_world_size()
    torch.set_grad_enabled(os.environ.get("SYMM_AB_GRAD", "on") == "on")
    t = symm.empty(1, torch.float32) if n > 1 else torch.ones(1)
    # The timing loop of `python -m symm.perf`: the API function called as user code calls it.
    if os.environ["SYMM_AB_OP"] == "broadcast":
        fast = partial(symm.shmem_broadcast, t, 0)
    elif os.environ["SYMM_AB_OP"] == "alltoall":
        send, recv = (symm.empty(2 * n, torch.float32) if n > 1 else torch.ones(2) for _ in range(2))
        parts = [send[2 * i : 2 * i + 2] for i in range(n)]
        fast = partial(symm.shmem_alltoall, parts, recv, torch.full((n,), 2, dtype=torch.int64))
    else:
        fast = partial(symm.shmem_allreduce, t, "sum")
    call_loop(fast, 20000)
    print("ready", symm.__file__, flush=True)
    for line in sys.stdin:
        calls = int(line)
        symm.barrier()
        print(call_loop(fast, calls) / calls * 1e9, flush=True)
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=1, choices=(1, 2))
    p.add_argument("--op", default="allreduce", choices=("allreduce", "broadcast", "alltoall"))
    p.add_argument("--grad", default="on", choices=("on", "off"), help="grad mode in the timed calls")
    p.add_argument("--rounds", type=int, default=120)
    p.add_argument("--calls", type=int, default=100000)
    p.add_argument("builds", nargs="+")
    args = p.parse_args()
    workers = {}
    for i, build in enumerate(args.builds):
        build = os.path.abspath(build)
        procs = []
        for r in range(args.ranks):
            env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=build, MASTER_ADDR="127.0.0.1", SYMM_AB_OP=args.op)
            env["SYMM_AB_GRAD"] = args.grad
            env.update(MASTER_PORT=str(29850 + i), RANK=str(r), WORLD_SIZE=str(args.ranks))
            procs.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--worker"],
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                )
            )
        for proc in procs:
            line = proc.stdout.readline()
            if not line.startswith("ready") or not line.split()[1].startswith(build + os.sep):
                raise SystemExit(f"{build}: the worker did not start on this build: {line!r}")
        workers[build] = procs
    times = {b: [] for b in workers}
    order = list(workers)
    for r in range(args.rounds):
        for build in order if r % 2 == 0 else order[::-1]:
            for proc in workers[build]:
                proc.stdin.write(f"{args.calls}\n")
                proc.stdin.flush()
            times[build].append(max(float(proc.stdout.readline()) for proc in workers[build]))
    for procs in workers.values():
        for proc in procs:
            proc.stdin.close()
        for proc in procs:
            proc.wait()
    first = order[0]
    print(
        f"# {args.op}, {args.ranks} rank(s), grad mode {args.grad}, {args.rounds} rounds of {args.calls} calls; "
        "ns per call (slowest rank)"
    )
    for build in order:
        x = times[build]
        q = statistics.quantiles(x, n=10)
        paired = statistics.median(a / b for a, b in zip(x, times[first]))
        print(
            f"{build}: best {min(x):.1f} p10 {q[0]:.1f} p50 {statistics.median(x):.1f} "
            f"p90 {q[8]:.1f}; paired median / {os.path.basename(first)}: {paired:.3f}"
        )


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker()
    else:
        main()
