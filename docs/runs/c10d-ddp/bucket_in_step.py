"""The allreduce of each DDP bucket inside the step of `python -m symm.perf --ddp` (2 ranks, batch
8), timed by a blocking hook, against the same bucket size alone (ordinary and symmetric
tensor). ADOPT=1 moves each bucket into the symmetric heap first (as symm.ddp.allreduce_hook
does); VIEW=1 sets gradient_as_bucket_view.

    [ADOPT=1] [VIEW=1] PYTHONPATH=<symm> python docs/runs/c10d-ddp/bucket_in_step.py
"""
import os, socket, time, sys
import torch, torch.distributed as dist, torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)])

def rank_main(rank, port):
    import symm
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    sg = dist.new_group(backend="symm")
    times = []
    keep = []
    def hook(state, bucket):
        t = bucket.buffer()
        if os.environ.get("ADOPT") and not symm.is_symmetric(t):
            s = symm.empty(t.numel(), t.dtype); s.copy_(t)
            t.untyped_storage()._swap_data_ptr_(s.untyped_storage()); keep.append(s)
        t.div_(2)
        t0 = time.perf_counter()
        symm.shmem_allreduce(t, "sum", sg)
        times.append((t.numel()*4>>20, time.perf_counter()-t0))
        fut = torch.futures.Future(); fut.set_result(t); return fut
    d = DDP(model(), process_group=sg, gradient_as_bucket_view=bool(os.environ.get('VIEW'))); d.register_comm_hook(None, hook)
    opt = torch.optim.SGD(d.parameters(), lr=1e-3)
    x = torch.randn(8, 1024, generator=torch.Generator().manual_seed(rank))
    def step():
        opt.zero_grad(set_to_none=False)
        d(x).square().mean().backward(); opt.step()
    for _ in range(3): step()
    dist.barrier(); times.clear()
    t0 = time.perf_counter()
    for _ in range(15): step()
    st = (time.perf_counter()-t0)/15*1e3
    by = {}
    for mb, s in times: by.setdefault(mb, []).append(s*1e3)
    # isolated
    iso = {}
    for mb in sorted(by):
        t = torch.randn(mb<<18)
        for _ in range(3): symm.shmem_allreduce(t, "sum", sg)
        ts=[]
        for _ in range(10):
            dist.barrier(group=sg); a=time.perf_counter(); symm.shmem_allreduce(t,"sum",sg); ts.append((time.perf_counter()-a)*1e3)
        ts.sort(); iso[mb]=ts[len(ts)//2]
        s = symm.empty(mb<<18, torch.float32); s.copy_(t)
        ts=[]
        for _ in range(10):
            dist.barrier(group=sg); a=time.perf_counter(); symm.shmem_allreduce(s,"sum",sg); ts.append((time.perf_counter()-a)*1e3)
        ts.sort(); iso[(mb,'sym')]=ts[len(ts)//2]
    if rank == 0:
        print(f"step {st:.2f} ms")
        for mb, v in by.items():
            v.sort(); print(f"bucket {mb} MiB in step: median {v[len(v)//2]:.2f} min {v[0]:.2f}; isolated ordinary {iso[mb]:.2f} symmetric {iso[(mb,'sym')]:.2f}")
    dist.destroy_process_group()

if __name__ == "__main__":
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    mp.spawn(rank_main, args=(port,), nprocs=2)
