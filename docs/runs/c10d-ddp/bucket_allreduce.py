"""One DDP bucket's allreduce (25 MiB of float32, DDP's default bucket) on 2 ranks, four ways:
through torch.distributed's backend "symm" (the tensor is DDP's: ordinary memory, staged by
symm), the same symm call on a symmetric tensor (zero-copy), the copies that staging adds, and
Gloo. Milliseconds per call, rank 0, three rounds.

    PYTHONPATH=<symm> python docs/runs/c10d-ddp/bucket_allreduce.py
"""

import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank: int, port: int) -> None:
    import symm

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2
    )
    sg = dist.new_group(backend="symm")
    t = torch.randn(25 << 18)
    s = symm.empty(t.numel(), torch.float32, group=sg)
    s.copy_(t)

    def ms(f, k=20):
        for _ in range(3):
            f()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(k):
            f()
        return (time.perf_counter() - t0) / k * 1e3

    ways = {
        "dist.all_reduce over 'symm' (staged)": lambda: dist.all_reduce(t, group=sg),
        "  the same, async_op=True + wait()": lambda: dist.all_reduce(
            t, group=sg, async_op=True
        ).wait(),
        "symm.shmem_allreduce, symmetric tensor": lambda: symm.shmem_allreduce(
            s, "sum", sg
        ),
        "copy in + copy out (what staging adds)": lambda: (s.copy_(t), t.copy_(s)),
        "dist.all_reduce over 'gloo'": lambda: dist.all_reduce(t),
    }
    rounds = {name: [ms(f) for _ in range(3)] for name, f in ways.items()}
    if rank == 0:
        for name, r in rounds.items():
            print(f"{name:<42} " + " ".join(f"{x:7.2f}" for x in r))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("SYMMETRIC_MEMORY_HEAP_SIZE", "256M")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(rank_main, args=(port,), nprocs=2, join=True)
    sys.exit(0)
