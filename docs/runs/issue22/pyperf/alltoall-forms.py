import os, time
import torch, torch.distributed as dist
from mpi4py import MPI
c = MPI.COMM_WORLD
rank = c.Get_rank()
port = c.bcast(29633 if rank == 0 else None, root=0)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
torch.set_num_threads(1)
import symm
from symm.perf import call_loop
from functools import partial
symm.init()
os.sched_setaffinity(0, {rank})
send = symm.empty(2, torch.float32); recv = symm.empty(2, torch.float32)
parts = [send[0:1], send[1:2]]
cases = {
    "alltoall int list": partial(symm.shmem_alltoall, parts, recv, [1, 1]),
    "alltoall int64 tensor": partial(symm.shmem_alltoall, parts, recv, torch.tensor([1, 1])),
    "alltoall plain send tensors": partial(symm.shmem_alltoall, [torch.ones(1), torch.ones(1)], recv, [1, 1]),
    "allgather": partial(symm.shmem_allgather, recv, send[0:1]),
    "sendrecv": partial(symm.shmem_sendrecv, send, 1 - rank, recv, 1 - rank),
    "mpi4py Alltoall": partial(c.Alltoall, send.numpy(), recv.numpy()),
}
for rnd in range(3):
    for name, f in cases.items():
        for _ in range(2000): f()
        symm.barrier()
        t = call_loop(f, 50000) / 50000
        t = c.allreduce(t, op=MPI.MAX)
        if rank == 0: print(f"round {rnd} {name:30s} {t*1e6:.3f} us", flush=True)
symm.free(send); symm.free(recv)
dist.destroy_process_group()
