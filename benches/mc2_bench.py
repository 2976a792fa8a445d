#!/usr/bin/env python3
"""Fused MC2 operators (symm.mc2) against the unfused sequence, in one run.

    python benches/mc2_bench.py [--ranks 2] [--iters 15] [--shapes 512x1024x256,1024x1024x128]
                                [--device cpu|npu] [--dtype float32]

Spawns ``--ranks`` processes (a gloo world and symm over it; on the CPU rank r pinned to CPU r
with one torch thread, on ``npu`` rank r on device r). For each shape ``m x k x n`` (a:
``(m, k)`` per rank, b: ``(k, n)``; matmul + reduce-scatter: x1 ``(ranks * m, k)``), tensors on
``--device``, it times, median of ``--iters`` after warm-up, in microseconds (on a device, from
an idle device until the device has finished the call: ``torch.npu.synchronize``):

- ``comm``: the collective alone (symm all-gather of ``a``; symm reduce-scatter of the product);
- ``mm``: the matmul alone;
- ``unfused``: the collective, then the matmul (or the matmul, then the collective);
- ``fused``: ``symm.mc2.fused_all_gather_matmul`` (``fused_matmul_reduce_scatter``);
- ``fused/unfused``, and the overlap achieved: ``(unfused - fused) / min(comm, mm)``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


def _median_us(fn, iters: int, barrier, sync) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        sync()
        barrier()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _shape_rows(shape: str, world: int, args: argparse.Namespace, place) -> list:
    """The table's rows of one shape ``m x k x n``: both operators, unfused and fused."""
    import symm
    import torch
    from symm import mc2

    m, k, n = (int(v) for v in shape.split("x"))
    on = {"dtype": getattr(torch, args.dtype), "device": place}
    a, b = torch.randn(m, k, **on), torch.randn(k, n, **on)
    c, g = torch.empty(world * m, n, **on), torch.empty(world * m, k, **on)
    x1 = torch.randn(world * m, k, **on)
    part = torch.empty(m, n, **on)
    product = x1 @ b

    def gather():
        symm.shmem_allgather(g, a)

    def ag_unfused():
        gather()
        torch.mm(g, b, out=c)

    def scatter():
        symm.shmem_reduce_scatter(part, product)

    def rs_unfused():
        # As a caller writes it, and as the fused call returns: a new output tensor.
        symm.shmem_reduce_scatter(torch.empty(m, n, **on), torch.mm(x1, b, out=product))

    cases = [
        ("all_gather+matmul", gather, lambda: torch.mm(g, b, out=c), ag_unfused,
         lambda: mc2.fused_all_gather_matmul(a, b, c, g, block_size=args.block)),
        ("matmul+reduce_scatter", scatter, lambda: torch.mm(x1, b, out=product), rs_unfused,
         lambda: mc2.fused_matmul_reduce_scatter(x1, b, product, block_size=args.block)),
    ]  # fmt: skip
    rows = []
    sync = torch.npu.synchronize if args.device == "npu" else (lambda: None)
    for name, comm, mm, unfused, fused in cases:
        t = [_median_us(f, args.iters, symm.barrier, sync) for f in (comm, mm)]
        # Unfused and fused alternate, so that both see the same machine state.
        pair: dict = {"unfused": [], "fused": []}
        for _ in range(3):
            pair["unfused"].append(_median_us(unfused, args.iters, symm.barrier, sync))
            pair["fused"].append(_median_us(fused, args.iters, symm.barrier, sync))
        tu, tf = min(pair["unfused"]), min(pair["fused"])
        rows.append((name, shape, t[0], t[1], tu, tf, tf / tu, (tu - tf) / min(t)))
    return rows


def _worker(rank: int, world: int, init: str, args: argparse.Namespace) -> None:
    import symm
    import torch
    import torch.distributed as dist

    if args.device == "npu":
        import torch_npu  # noqa: F401 - registers torch.npu

        torch.npu.set_device(rank)
        place = torch.device("npu", rank)
    else:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
        torch.set_num_threads(1)
        place = torch.device("cpu")
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    symm.init()
    rows = [
        row
        for shape in args.shapes.split(",")
        for row in _shape_rows(shape, world, args, place)
    ]
    if rank == 0:
        print(
            f"# {world} ranks, {args.device}, {args.dtype}, {args.iters} iterations, "
            f"block {args.block or 'default'}; times in us"
        )
        print(f"{'op':>22} {'m x k x n':>16} {'comm':>9} {'mm':>9} {'unfused':>9} {'fused':>9} "
              f"{'fused/unf':>9} {'overlap':>8}")  # fmt: skip
        for name, shape, tc, tm, tu, tf, ratio, ov in rows:
            print(
                f"{name:>22} {shape:>16} {tc:9.1f} {tm:9.1f} {tu:9.1f} {tf:9.1f} {ratio:9.3f} {ov:8.2f}"
            )
    symm.barrier()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--iters", type=int, default=15)
    p.add_argument("--shapes", default="256x1024x512,512x1024x256,1024x512x128")
    p.add_argument(
        "--block",
        type=int,
        default=None,
        help="rows per pipelined block (default: 4 blocks)",
    )
    p.add_argument(
        "--device",
        choices=("cpu", "npu"),
        default="cpu",
        help="where the tensors are (npu: torch_npu)",
    )
    p.add_argument(
        "--dtype", default="float32", help="the tensors' torch dtype (default float32)"
    )
    args = p.parse_args()
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init = f"file://{tmp}/store"
        mp.spawn(_worker, args=(args.ranks, init, args), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    sys.exit(main())
