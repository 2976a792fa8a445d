"""HyperParallel's code run unchanged: its compare codes, and the names it calls (run by worker.py
as ``scenarios_hp.<name>``)."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

import symm
from scenarios import expect

N = 1024


def wait_for_signal_codes(rank, world):
    """HyperParallel's wait_for_signal pattern: a peer writes 42s, then sets a signal; the
    waiter waits with HyperParallel's compare codes (1 = greater than, 2 = less than) and must
    then read the 42s."""
    peer, prev = (rank + 1) % world, (rank - 1) % world
    data = symm.empty(N, torch.float32)
    data.zero_()
    sig = symm.empty(2, torch.int32)
    sig.zero_()
    sig[1] = 5
    symm.barrier()

    # Late on purpose: a wait that holds too early returns while the data is still zeros.
    def produce():
        time.sleep(0.3)
        symm.shmem_put(data, 0, torch.full((N,), 42.0), 0, N, peer)
        symm.shmem_signal_op(sig, 0, 2, 0, peer)  # signal_op 0: set

    if rank % 2 == 0:
        produce()
    # compare_op=1: "greater than". Read as Ascend SHMEM's `ne`, 0 != 1 held at once.
    seen = symm.shmem_wait_for_signal(data, sig, 0, 1, 1)
    assert seen == 2, seen
    assert torch.all(data == 42.0), f"the wait returned before the data arrived: {data[:4]}"
    if rank % 2 == 1:
        produce()
    symm.barrier()

    # compare_op=2: "less than". The peer lowers the signal from 5 to 3; read as Ascend SHMEM's
    # `gt` (5 > 5) the wait never ended.
    if rank % 2 == 0:
        time.sleep(0.2)
        symm.shmem_signal_op(sig, 1, 3, 0, peer)
    assert symm.shmem_wait_for_signal(None, sig, 1, 5, 2, timeout=10) == 3
    if rank % 2 == 1:
        time.sleep(0.2)
        symm.shmem_signal_op(sig, 1, 3, 0, peer)
    symm.barrier()

    # compare_op=0 (eq) as HyperParallel's collectives wait, with the value as a one-element
    # int32 tensor and the offset as an int64 tensor, as its kernels take them.
    symm.shmem_put_with_signal(data, 0, torch.full((N,), float(rank)), 0, N, sig, 0, 7, 0, peer)
    one = torch.tensor([0], dtype=torch.int64)
    assert symm.shmem_wait_for_signal(data, sig, one, torch.tensor([7], dtype=torch.int32), 0) == 7
    assert torch.all(data == float(prev))
    symm.barrier()

    # ne, ge, le after HyperParallel's three, by code and by name (the signal is 7 here).
    for op, value, holds in [
        (3, 7, False),
        ("ne", 6, True),
        (4, 7, True),
        ("GE", 8, False),
        (5, 7, True),
        ("le", 6, False),
        ("gt", 7, False),
        ("lt", 8, True),
    ]:
        if holds:
            assert symm.shmem_wait_for_signal(None, sig, 0, value, op, timeout=5) == 7, (op, value)
        else:
            expect(symm.Timeout, lambda: symm.shmem_wait_for_signal(None, sig, 0, value, op, timeout=0.05), "signal")
    expect(
        symm.InvalidArgument,
        lambda: symm.shmem_wait_for_signal(None, sig, 0, 0, 6),
        "compare_op",
        "0=eq, 1=gt, 2=lt, 3=ne, 4=ge, 5=le",
        rank=rank,
    )
    symm.barrier()
    dist.barrier()
