"""DDP's own cost on the model of `python -m symm.perf --ddp` (2 ranks, batch 8): the bare step, DDP
under no_sync, DDP with a hook that communicates nothing (what DDP itself adds: the gradients
copied into its buckets and back), DDP over "symm" and over "gloo". ms per step, rank 0: best
and median of three rounds. Argument: DDP keyword arguments as JSON, e.g.
'{"gradient_as_bucket_view": true}'.

    PYTHONPATH=<symm> python docs/runs/c10d-ddp/ddp_parts.py [json]
"""
import os, socket, time, sys
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)])

def ms(net, rank, k=15, no_sync=False):
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    x = torch.randn(8, 1024, generator=torch.Generator().manual_seed(rank))
    def step():
        opt.zero_grad(set_to_none=False)
        if no_sync:
            with net.no_sync(): net(x).square().mean().backward()
        else: net(x).square().mean().backward()
        opt.step()
    for _ in range(3): step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(k): step()
    return (time.perf_counter()-t0)/k*1e3

def rank_main(rank, port, kw):
    import symm
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    sg = dist.new_group(backend="symm")
    def noop(state, bucket):
        fut = torch.futures.Future(); fut.set_result(bucket.buffer()); return fut
    def noop_ddp(**k):
        d = DDP(model(), process_group=sg, **k); d.register_comm_hook(None, noop); return d
    ways = {
        "bare": lambda: ms(model(), rank),
        "ddp no_sync": lambda: ms(DDP(model(), process_group=sg, **kw), rank, no_sync=True),
        "ddp noop hook": lambda: ms(noop_ddp(**kw), rank),
        "ddp symm": lambda: ms(DDP(model(), process_group=sg, **kw), rank),
        "ddp gloo": lambda: ms(DDP(model(), **kw), rank),
    }
    res = {}
    for _ in range(3):
        for n, f in ways.items(): res.setdefault(n, []).append(f())
    if rank == 0:
        for n, v in res.items(): print(f"{n:20s} {min(v):7.2f} {sorted(v)[1]:7.2f}")
    dist.destroy_process_group()

if __name__ == "__main__":
    import json
    kw = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    mp.spawn(rank_main, args=(port, kw), nprocs=2)
