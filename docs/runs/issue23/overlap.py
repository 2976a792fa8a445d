#!/usr/bin/env python3
"""What overlapping an asynchronous allreduce with a torch matmul gives on this machine.

Two ranks (processes), each pinned to its own CPU, torch on one thread per rank. Per size, the
median over ROUNDS of: the matmul alone, the allreduce alone (blocking), both one after the
other, and both overlapped (allreduce with async_op=True, the matmul, then wait()).
Usage: python3 overlap.py [ROUNDS (30)]
"""

import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import symm

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 30
SIZES = [64 << 10, 1 << 20, 16 << 20]  # bytes of float32 per allreduce
MATMUL = 384  # n of the n x n float32 matmul (about 10 ms on one core here)


def median_ms(f):
    times = []
    for _ in range(ROUNDS):
        dist.barrier()
        t0 = time.perf_counter()
        f()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def rank_main(rank, port):
    os.sched_setaffinity(0, {rank % os.cpu_count()})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    symm.init()
    a, b = torch.randn(MATMUL, MATMUL), torch.randn(MATMUL, MATMUL)
    for size in SIZES:
        x = symm.empty(size // 4, dtype=torch.float32)
        x.fill_(1.0)
        matmul = lambda: torch.mm(a, b)  # noqa: E731
        allreduce = lambda: symm.shmem_allreduce(x)  # noqa: E731

        def sequential():
            allreduce()
            matmul()

        def overlapped():
            work = symm.shmem_allreduce(x, async_op=True)
            matmul()
            work.wait()

        for f in (matmul, allreduce, sequential, overlapped):
            f()  # warm-up
        row = [median_ms(f) for f in (matmul, allreduce, sequential, overlapped)]
        if rank == 0:
            m, c, s, o = row
            gain = (s - o) / min(m, c) if min(m, c) > 0 else 0.0
            print(f"{size:>10} B  matmul {m:8.3f} ms  allreduce {c:8.3f} ms  sequential {s:8.3f} ms  "
                  f"overlapped {o:8.3f} ms  hidden {100 * gain:5.1f} % of the shorter")
        symm.free(x)
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(f"# 2 ranks pinned, torch threads 1, matmul {MATMUL}x{MATMUL} float32, median of {ROUNDS} rounds")
    mp.spawn(rank_main, args=(port,), nprocs=2)
