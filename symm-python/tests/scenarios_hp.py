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
            expect(
                symm.Timeout,
                lambda value=value, op=op: symm.shmem_wait_for_signal(None, sig, 0, value, op, timeout=0.05),
                "signal",
            )
    expect(
        symm.InvalidArgument,
        lambda: symm.shmem_wait_for_signal(None, sig, 0, 0, 6),
        "compare_op",
        "0=eq, 1=gt, 2=lt, 3=ne, 4=ge, 5=le",
        rank=rank,
    )
    symm.barrier()
    dist.barrier()


def rendezvous_and_signal_pads(rank, world):
    """HyperParallel's other names: is_shmem_available, rendezvous, set/get_signal_pad_size."""
    assert world == 3
    assert symm.is_shmem_available()
    assert symm.get_signal_pad_size() == symm.DEFAULT_SIGNAL_PAD_SIZE == 4096

    # rendezvous: a handle with this rank's place in the group and a zeroed signal pad that
    # works with the signal calls.
    t = symm.empty((4, 8), torch.float32)
    h = symm.rendezvous(t, None)
    assert h.buffer is t and (h.rank, h.world_size) == (rank, world), h
    pad = h.signal_pad
    assert pad.dtype == torch.int32 and pad.numel() == 1024 and symm.is_symmetric(pad), pad
    assert torch.all(pad == 0)
    symm.barrier()  # every member checked its pad before anyone signals
    for r in range(world):
        symm.shmem_signal_op(pad, 3, 1, "add", r)
    assert symm.shmem_wait_for_signal(None, pad, 3, world, "eq", timeout=10) == world
    h.barrier()
    # The process group object, and a view of the tensor.
    h2 = symm.rendezvous(t[1], dist.group.WORLD)
    assert h2.buffer.numel() == 8 and h2.rank == rank and h2.signal_pad.data_ptr() != pad.data_ptr()
    symm.free(h2.signal_pad)
    symm.free(pad)

    # Members that pass different tensors: Mismatch on every member, naming both; the group
    # stays usable.
    u = symm.empty(16, torch.float32)
    e = expect(symm.Mismatch, lambda: symm.rendezvous(u if rank == 0 else t, None), "rendezvous", rank=rank)
    assert "heap offset" in str(e) and "global rank" in str(e), e
    symm.barrier()

    # A tensor that is not symmetric (or no tensor) fails on its rank; its peers learn it at
    # once (PeerRejected), not at the timeout.
    freed = symm.empty(4, torch.float32)
    symm.free(freed)
    for bad_rank, bad, needle in [(1, torch.zeros(4), "tensor"), (0, "x", "tensor"), (2, freed, "symm.free()")]:
        t0 = time.monotonic()
        if rank == bad_rank:
            expect(symm.InvalidArgument, lambda bad=bad: symm.rendezvous(bad, None), needle, rank=rank)
        else:
            expect(symm.PeerRejected, lambda: symm.rendezvous(t, None), "rendezvous", rank=rank)
        assert time.monotonic() - t0 < 10, "a peer waited for the timeout"
        symm.barrier()

    # Signal pad sizes: validated; they must agree between the members.
    for bad in [0, -4, 6, 2.0, "64", True, None]:
        expect(symm.InvalidArgument, lambda bad=bad: symm.set_signal_pad_size(bad), "size", rank=rank)
    assert symm.get_signal_pad_size() == 4096
    symm.set_signal_pad_size(64 if rank == 2 else 4096)
    e = expect(symm.Mismatch, lambda: symm.rendezvous(t, None), "signal pad size", rank=rank)
    assert "64 bytes" in str(e) and "4096 bytes" in str(e), e
    symm.set_signal_pad_size(torch.tensor(64))  # anything with __index__
    assert symm.get_signal_pad_size() == 64
    h3 = symm.rendezvous(t, None)
    assert h3.signal_pad.numel() == 16 and torch.all(h3.signal_pad == 0)
    symm.free(h3.signal_pad)
    symm.set_signal_pad_size(symm.DEFAULT_SIGNAL_PAD_SIZE)

    # A tensor of a sub-group: rendezvous in that group works; in a group with a rank that did
    # not allocate it, GroupError on the ranks that pass it, PeerRejected on the other.
    g01 = symm.create_group([0, 1])
    if rank < 2:
        s = symm.empty(8, torch.float32, group=g01)
        hs = symm.rendezvous(s, g01)
        assert (hs.rank, hs.world_size) == (rank, 2)
        hs.barrier()
        symm.free(hs.signal_pad)
        expect(symm.GroupError, lambda: symm.rendezvous(s, None), "allocated in the group", rank=rank)
    else:
        expect(symm.PeerRejected, lambda: symm.rendezvous(t, None), "rendezvous", rank=rank)
    symm.barrier()
    dist.barrier()
