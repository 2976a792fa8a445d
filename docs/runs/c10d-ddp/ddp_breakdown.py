"""Where the DDP step of ``python -m symm.perf --ddp`` spends its time over "symm" (2 ranks, the
same model: 8 x Linear(1024, 1024), batch 8): the bare step, DDP without communication
(``no_sync``), DDP over "symm" as is (asynchronous allreduce on symm's stream), with a hook that
calls symm's blocking allreduce instead (no hand-over to symm's thread), and DDP over Gloo.
Milliseconds per step, rank 0, two rounds.

    PYTHONPATH=<symm> python docs/runs/c10d-ddp/ddp_breakdown.py
"""

import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)])


def ms_per_step(net, rank, no_sync=False, k=15):
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    x = torch.randn(8, 1024, generator=torch.Generator().manual_seed(rank))

    def step():
        opt.zero_grad(set_to_none=False)
        if no_sync:
            with net.no_sync():
                net(x).square().mean().backward()
        else:
            net(x).square().mean().backward()
        opt.step()

    for _ in range(3):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(k):
        step()
    return (time.perf_counter() - t0) / k * 1e3


def rank_main(rank, port):
    import symm

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2
    )
    sg = dist.new_group(backend="symm")

    def blocking_hook(state, bucket):
        t = bucket.buffer().div_(2)
        symm.shmem_allreduce(t, "sum", sg)
        fut = torch.futures.Future()
        fut.set_result(t)
        return fut

    def hooked():
        d = DDP(model(), process_group=sg)
        d.register_comm_hook(None, blocking_hook)
        return d

    ways = {
        "bare model (no DDP)": lambda: ms_per_step(model(), rank),
        "DDP over 'symm', no_sync": lambda: ms_per_step(
            DDP(model(), process_group=sg), rank, no_sync=True
        ),
        "DDP over 'symm'": lambda: ms_per_step(DDP(model(), process_group=sg), rank),
        "DDP over 'symm', blocking symm hook": lambda: ms_per_step(hooked(), rank),
        "DDP over 'gloo'": lambda: ms_per_step(DDP(model()), rank),
    }
    rounds = {}
    for _ in range(2):
        for name, f in ways.items():
            rounds.setdefault(name, []).append(f())
    if rank == 0:
        for name, r in rounds.items():
            print(f"{name:<38} " + " ".join(f"{x:7.2f}" for x in r))
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("SYMMETRIC_MEMORY_HEAP_SIZE", "256M")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    mp.spawn(rank_main, args=(port,), nprocs=2, join=True)
