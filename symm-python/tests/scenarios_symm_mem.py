"""PyTorch's symmetric-memory handle on CPU (``symm.rendezvous``'s result), checked with the
semantics of PyTorch's own device-agnostic tests (test/distributed/test_symmetric_memory.py:
``_verify_symmetric_memory``, ``test_get_signal_pad``, ``test_subgroup``...). Run by worker.py as
``scenarios_symm_mem.<name>`` on 2 and 3 ranks."""

from __future__ import annotations

import gc
import time

import torch
import torch.distributed as dist

import symm
from scenarios import expect

ROWS, COLS = 8, 16  # the buffer: ROWS x COLS float32


def _handle(rank):
    t = symm.empty((ROWS, COLS), torch.float32)
    t.fill_(rank)
    h = symm.rendezvous(t, None)
    h.barrier()  # every member's fill is done
    return t, h


def attributes_and_aliasing(rank, world):
    """rank, world_size, buffer_size, buffer_ptrs and signal_pad_ptrs agree with get_buffer and
    get_signal_pad; a write through get_buffer(peer) is seen in the peer's own tensor, and a
    write into one's own tensor is seen through the peers' get_buffer views."""
    peer, prev = (rank + 1) % world, (rank - 1) % world
    t, h = _handle(rank)
    nbytes = ROWS * COLS * 4
    assert (h.rank, h.world_size) == (rank, world), h
    assert (h.buffer_size, h.offset, h.signal_pad_size) == (nbytes, 0, symm.get_signal_pad_size()), h
    ptrs = h.buffer_ptrs
    assert len(ptrs) == world and len(set(ptrs)) == world, ptrs
    assert ptrs[rank] == t.data_ptr(), (ptrs, t.data_ptr())
    pads = h.signal_pad_ptrs
    assert len(pads) == world and pads[rank] == h.signal_pad.data_ptr() and not set(pads) & set(ptrs), pads

    # PyTorch's checks of get_buffer: the address is buffer_ptrs[r], the storage the whole
    # allocation, the values the member's.
    for r in range(world):
        buf = h.get_buffer(r, (ROWS, COLS), torch.float32)
        assert buf.shape == (ROWS, COLS) and buf.dtype == torch.float32
        assert buf.data_ptr() == ptrs[r] and buf.storage_offset() == 0, (buf.data_ptr(), ptrs[r])
        assert buf.untyped_storage().nbytes() == h.buffer_size
        assert torch.all(buf == r), (r, buf)
        whole = h.get_buffer(r, (h.buffer_size // 4,), torch.float32)  # as _verify_symmetric_memory
        assert whole.data_ptr() == ptrs[r] and whole.numel() == ROWS * COLS
    # The native accessor agrees: a member's address of a tensor's first element.
    st = symm._api._current()
    g = st.world
    assert st.comm.peer_address(g, peer, st.platform.describe(t[2])) == ptrs[peer] + 2 * COLS * 4
    h.barrier()  # every member has read its peers' copies before anyone writes

    # Through the peer's view into the peer's own tensor: row `rank` of the next rank's copy.
    view = h.get_buffer(peer, (ROWS, COLS), torch.float32)
    view[rank].fill_(100.0 + rank)
    h.put_signal(peer)
    h.wait_signal(prev)
    assert torch.all(t[prev] == 100.0 + prev), t
    assert torch.all(t[rank] == (100.0 + rank if world == 1 else rank)), t
    h.barrier()
    # And the reverse: into one's own tensor, seen through every peer's view of it.
    t[ROWS - 1].fill_(200.0 + rank)
    h.barrier()
    for r in range(world):
        assert torch.all(h.get_buffer(r, (ROWS, COLS), torch.float32)[ROWS - 1] == 200.0 + r), r
    h.barrier()

    # Offsets and dtypes: elements from the allocation's start, in any dtype.
    row = h.get_buffer(peer, (COLS,), torch.float32, storage_offset=3 * COLS)
    assert row.data_ptr() == ptrs[peer] + 3 * COLS * 4 and row.storage_offset() == 3 * COLS
    assert torch.all(row == peer) and row.untyped_storage().nbytes() == h.buffer_size
    raw = h.get_buffer(peer, (nbytes,), torch.uint8)
    assert torch.equal(raw.view(torch.float32)[3 * COLS : 4 * COLS], torch.full((COLS,), float(peer)))
    halves = h.get_buffer(peer, (2, nbytes // 4), torch.bfloat16)
    assert halves.shape == (2, nbytes // 4) and halves.data_ptr() == ptrs[peer]
    longs = h.get_buffer(peer, (4,), torch.int64, storage_offset=nbytes // 8 - 4)  # the last 32 bytes
    assert longs.data_ptr() == ptrs[peer] + nbytes - 32
    empty = h.get_buffer(peer, (0,), torch.float32, storage_offset=ROWS * COLS)  # at the very end
    assert empty.numel() == 0
    # Sizes and offsets given as tensors / torch.Size, as shapes often are.
    assert h.get_buffer(torch.tensor(peer), torch.Size([2, COLS]), torch.float32, torch.tensor(COLS)).shape == (2, COLS)

    # A handle of a view: the allocation is the buffer; `offset` is where the view starts.
    h2 = symm.rendezvous(t[2], None)
    assert (h2.offset, h2.buffer_size) == (2 * COLS * 4, nbytes) and h2.buffer_ptrs == ptrs, (h2.offset, h2.buffer_ptrs)
    assert torch.equal(h2.get_buffer(peer, (ROWS, COLS), torch.float32), view)
    symm.free(h2.signal_pad)

    # get_signal_pad: the pad's dtype and size by default, PyTorch's arguments otherwise.
    for r in range(world):
        pad = h.get_signal_pad(r)
        assert pad.dtype == torch.int32 and pad.numel() == h.signal_pad_size // 4 and pad.data_ptr() == pads[r]
    assert h.get_signal_pad(peer, (8, 8)).shape == (8, 8)
    assert h.get_signal_pad(peer, dtype=torch.int64).numel() == h.signal_pad_size // 8
    assert h.get_signal_pad(peer, dtype=torch.uint32, storage_offset=4).numel() == h.signal_pad_size // 4 - 4
    # Writes into the buffer leave the pad alone (PyTorch's "sanity check"). symm's own barriers
    # (not the pad's) keep the peers' pad barrier below from signalling this pad meanwhile.
    symm.barrier()
    mine = h.get_signal_pad(rank)
    before = mine.clone()
    t.fill_(0)
    assert torch.equal(mine, before) and torch.equal(mine, h.signal_pad)
    symm.barrier()
    h.barrier()

    # Refusals, naming the argument and its value; nothing is touched.
    for bad in (world, -1):
        e = expect(symm.GroupError, lambda bad=bad: h.get_buffer(bad, (1,), torch.float32), f"rank = {bad}", rank=rank)
        assert f"group of {world} ranks" in str(e), e
    expect(symm.InvalidArgument, lambda: h.get_buffer("0", (1,), torch.float32), "rank", rank=rank)
    expect(
        symm.InvalidArgument,
        lambda: h.get_buffer(peer, (ROWS + 1, COLS), torch.float32),
        "sizes = (9, 16)",
        "past the 512 bytes",
        rank=rank,
    )
    expect(
        symm.InvalidArgument,
        lambda: h.get_buffer(peer, (nbytes + 1,), torch.uint8),
        f"sizes = ({nbytes + 1},)",
        rank=rank,
    )
    expect(
        symm.InvalidArgument,
        lambda: h.get_buffer(peer, (COLS,), torch.float32, ROWS * COLS - COLS + 1),
        "storage_offset = 113",
        rank=rank,
    )
    expect(
        symm.InvalidArgument,
        lambda: h.get_buffer(peer, (1,), torch.float64, nbytes // 8),
        "storage_offset = 64",
        rank=rank,
    )
    expect(symm.InvalidArgument, lambda: h.get_buffer(peer, (1,), torch.float32, -1), "storage_offset = -1", rank=rank)
    expect(
        symm.InvalidArgument, lambda: h.get_buffer(peer, (1,), torch.float32, 1.5), "storage_offset = 1.5", rank=rank
    )
    expect(
        symm.InvalidArgument, lambda: h.get_buffer(peer, (-1, 4), torch.float32), "sizes = (-1, 4)", ">= 0", rank=rank
    )
    expect(symm.InvalidArgument, lambda: h.get_buffer(peer, "big", torch.float32), "sizes = 'big'", rank=rank)
    expect(symm.InvalidArgument, lambda: h.get_buffer(peer, (1,), "float32"), "dtype = 'float32'", rank=rank)
    expect(symm.InvalidArgument, lambda: h.get_signal_pad(peer, (h.signal_pad_size,), torch.int32), "sizes", rank=rank)
    h.barrier()
    symm.free(h.signal_pad)
    dist.barrier()


def signals_and_barrier_order(rank, world):
    """barrier / put_signal / wait_signal with PyTorch's semantics: a put_signal's writes are
    seen after the matching wait_signal; a barrier orders every member's writes; signals are
    consumed (a second wait needs a second put), flags sit where PyTorch puts them, a put waits
    until the previous signal was consumed; bounded waits raise Timeout naming what they awaited."""
    t, h = _handle(rank)
    n = ROWS * COLS
    chans = h.signal_pad_size // (8 * world)

    # PyTorch's _verify_symmetric_memory, for every rank but 0 in turn.
    buf = h.get_buffer(0, (n,), torch.float32)
    if rank == 0:
        for src in range(1, world):
            h.wait_signal(src_rank=src)
            assert torch.all(buf == 42), (src, buf)
    else:
        if rank == 2:
            time.sleep(0.2)  # late on purpose: the wait must not return before the data
        buf.fill_(42)
        h.put_signal(dst_rank=0)
    h.barrier()
    if rank == 0:
        h.barrier()
        assert torch.all(buf == 43), buf
    else:
        if rank == world - 1:
            time.sleep(0.2)
            buf.fill_(43)
        h.barrier()
    h.barrier()

    # Both ways round a ring on every channel, many rounds back to back: each round's value
    # arrives before its signal. Rows alternate between rounds: a rank writes round i + 1
    # while its neighbour may still read round i (but not round i + 2, which comes after the
    # neighbour's own signal of round i + 1).
    peer, prev = (rank + 1) % world, (rank - 1) % world
    neighbours = [peer] if world == 2 else [peer, prev]
    views = {r: h.get_buffer(r, (ROWS, COLS), torch.float32) for r in neighbours}
    for i in range(40):
        ch = i % chans
        for r in neighbours:
            views[r][2 * rank + i % 2].fill_(float(i))
            h.put_signal(r, ch)
        for r in neighbours:
            h.wait_signal(r, ch)
            assert torch.all(t[2 * r + i % 2] == float(i)), (i, r, t[2 * r + i % 2])
        if i % 10 == 9:
            h.barrier(channel=(i // 10) % chans)
    h.barrier(channel=chans - 1)

    # PyTorch's layout: the flag src sets in dst's pad on channel c is word c * world + src; a
    # wait consumes it.
    c = min(2, chans - 1)
    if rank == 1:
        h.put_signal(0, channel=c)
    symm.barrier()  # not the pad's: the flag stays where it is
    if rank == 0:
        assert int(h.signal_pad[c * world + 1]) == 1, h.signal_pad[: 4 * world]
        h.wait_signal(1, channel=c)
        assert int(h.signal_pad[c * world + 1]) == 0
        # Consumed: a second wait has nothing to take.
        e = expect(
            symm.Timeout, lambda: h.wait_signal(1, channel=c, timeout_ms=100), "wait_signal(src_rank=1", rank=rank
        )
        assert f"channel {c}" in str(e) and "no signal from group rank 1" in str(e), e
    h.barrier()

    # A put waits until the previous signal was consumed, as PyTorch's compare-and-swap.
    if rank == 1:
        h.put_signal(0, channel=1)
        t0 = time.monotonic()
        h.put_signal(0, channel=1)  # rank 0 takes the first one 1 s from now
        assert time.monotonic() - t0 > 0.3, "the second put did not wait for the first to be consumed"
        e = expect(
            symm.Timeout,
            lambda: h.put_signal(0, channel=1, timeout_ms=100),
            "put_signal(dst_rank=0, channel=1)",
            rank=rank,
        )
        assert "has not consumed" in str(e), e
    elif rank == 0:
        time.sleep(1.0)
        h.wait_signal(1, channel=1)
        time.sleep(0.6)  # meanwhile rank 1's third put times out: the second is not consumed
        h.wait_signal(1, channel=1)
    h.barrier(channel=1)

    # A wait_signal timeout is bounded and says what it waited for (PyTorch traps instead).
    t0 = time.monotonic()
    quiet = min(3, chans - 1)  # a channel nobody signals now (a peer's next barrier uses 0)
    e = expect(symm.Timeout, lambda: h.wait_signal(prev, quiet, 150), f"src_rank={prev}", f"channel {quiet}", rank=rank)
    assert 0.1 < time.monotonic() - t0 < 5, time.monotonic() - t0
    assert isinstance(e, TimeoutError) and isinstance(e, RuntimeError)
    h.barrier()
    # A barrier some peer never joins times out too, naming the peer it waited for.
    if rank == 0:
        e = expect(symm.Timeout, lambda: h.barrier(channel=0, timeout_ms=200), "barrier(channel=0)", rank=rank)
        assert "group rank" in str(e), e
    symm.barrier()
    if rank != 0:
        h.barrier(channel=0)  # takes rank 0's signal of the barrier that timed out ...
    else:
        for src in range(1, world):
            h.wait_signal(src, channel=0)  # ... and rank 0 the peers' signals of this one
    h.barrier()

    # Refusals: channels outside the pad, ranks outside the group, timeouts that are not ints.
    expect(
        symm.InvalidArgument,
        lambda: h.barrier(channel=chans),
        f"channel = {chans}",
        f"channels 0 to {chans - 1}",
        rank=rank,
    )
    expect(symm.InvalidArgument, lambda: h.put_signal(0, channel=-1), "channel = -1", rank=rank)
    expect(symm.GroupError, lambda: h.put_signal(world), f"dst_rank = {world}", rank=rank)
    expect(symm.GroupError, lambda: h.wait_signal(-2), "src_rank = -2", rank=rank)
    expect(symm.InvalidArgument, lambda: h.wait_signal(0, timeout_ms=-5), "timeout_ms = -5", rank=rank)
    expect(symm.InvalidArgument, lambda: h.barrier(timeout_ms=0.5), "timeout_ms = 0.5", rank=rank)
    h.barrier(timeout_ms=0)  # PyTorch's "no timeout": SYMMETRIC_MEMORY_TIMEOUT
    h.barrier(timeout_ms=torch.tensor(5000))

    # A sub-group's handle: its ranks, channels and pads are the sub-group's (PyTorch's
    # test_subgroup: a peer's buffer through the sub-group's handle).
    g = symm.create_group(list(range(world - 1, -1, -1)))  # reversed order
    s = symm.empty(COLS, torch.float32, group=g)
    s.fill_(rank)
    hs = symm.rendezvous(s, g)
    assert (hs.rank, hs.world_size) == (world - 1 - rank, world), hs
    hs.barrier()
    for r in range(world):
        assert torch.all(hs.get_buffer(r, (COLS,), torch.float32) == world - 1 - r), r
    hs.put_signal((hs.rank + 1) % world)
    hs.wait_signal((hs.rank - 1) % world)
    hs.barrier()
    symm.free(hs.signal_pad)
    symm.free(h.signal_pad)
    dist.barrier()


def lifetime(rank, world):
    """As PyTorch's tests: the handle works after the original tensor is dropped; get_buffer
    views keep the allocation alive after the handle is dropped too, and release it when they
    go; after symm.free the handle refuses peer views, its signals still work."""
    peer, prev = (rank + 1) % world, (rank - 1) % world
    t = symm.empty(256, torch.float32)
    t.fill_(rank)
    h = symm.rendezvous(t, None)
    in_use = symm.memory_stats()["in_use"]
    del t
    gc.collect()
    assert symm.memory_stats()["in_use"] == in_use, "the handle did not keep the allocation"
    # PyTorch's _verify_symmetric_memory on the handle alone.
    buf = h.get_buffer(0, (h.buffer_size // 4,), torch.float32)
    assert buf.storage_offset() == 0 and buf.untyped_storage().nbytes() == h.buffer_size == 1024
    if rank == 0:
        for src in range(1, world):
            h.wait_signal(src_rank=src)
        assert torch.all(buf == 42), buf
    else:
        buf.fill_(42)
        h.put_signal(dst_rank=0)
    h.barrier()
    del buf

    # Views outlive the handle (and the handle's own reference to the tensor).
    into_peer = h.get_buffer(peer, (256,), torch.float32)
    mine = h.get_buffer(rank, (256,), torch.float32)
    pad = h.signal_pad
    del h
    gc.collect()
    symm.barrier()
    into_peer[rank] = 7.0 + rank
    symm.barrier()
    assert float(mine[prev]) == 7.0 + prev, mine[:4]
    symm.free(pad)  # the pad is the handle's other allocation
    held = symm.memory_stats()["in_use"]
    symm.barrier()
    del into_peer
    gc.collect()
    assert symm.memory_stats()["in_use"] == held, "one view still holds the allocation"
    del mine
    gc.collect()
    assert symm.memory_stats()["in_use"] == held - 4096, (held, symm.memory_stats())
    symm.barrier()

    # After symm.free: no more peer views or addresses (the released range may be reused);
    # the signals, on the handle's own pad, still work.
    t2 = symm.empty(64, torch.float32)
    h2 = symm.rendezvous(t2, None)
    view = h2.get_buffer(peer, (64,), torch.float32)
    symm.free(t2)
    del view  # it aliases released memory now, as any view of a freed tensor
    expect(symm.InvalidArgument, lambda: h2.get_buffer(peer, (64,), torch.float32), "buffer", "symm.free()", rank=rank)
    expect(symm.InvalidArgument, lambda: h2.buffer_ptrs, "buffer", "symm.free()", rank=rank)
    assert len(h2.signal_pad_ptrs) == world
    h2.put_signal(peer)
    h2.wait_signal(prev)
    h2.barrier()
    symm.free(h2.signal_pad)
    expect(symm.InvalidArgument, lambda: h2.barrier(), "signal_pad", "symm.free()", rank=rank)
    symm.barrier()
    dist.barrier()


class _NoPeerMapping:
    """The native communicator of a backend whose ranks do not map each other's heaps (what
    Ascend's answers peer addresses with), around the CPU one."""

    def __init__(self, comm):
        self._comm = comm

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def _refuse(self, *args, **kwargs):
        rank = self._comm.rank
        e = symm.Unsupported(
            f"rank {rank}: reaching global rank 1's copy of a symmetric allocation by address (buffer_ptrs, "
            "signal_pad_ptrs, get_buffer, get_signal_pad: ...) is not supported by the ascend backend"
        )
        e.rank = rank
        raise e

    peer_address = peer_buffer = _refuse


def without_peer_mapping(rank, world):
    """On a backend that maps no peer heap, buffer_ptrs and get_buffer raise Unsupported naming
    the backend, while the rest of the handle works: its signals use the shmem primitives only."""
    t, h = _handle(rank)
    h._comm = _NoPeerMapping(h._comm)
    for call in (
        lambda: h.buffer_ptrs,
        lambda: h.signal_pad_ptrs,
        lambda: h.get_buffer((rank + 1) % world, (4,), torch.float32),
        lambda: h.get_signal_pad(rank),
    ):
        expect(symm.Unsupported, call, "ascend backend", "get_buffer", rank=rank)
    assert (h.rank, h.world_size, h.buffer_size) == (rank, world, ROWS * COLS * 4)
    peer, prev = (rank + 1) % world, (rank - 1) % world
    symm.shmem_put(t, rank * COLS, torch.full((COLS,), 5.0 + rank), 0, COLS, peer)
    h.put_signal(peer)
    h.wait_signal(prev)
    assert torch.all(t[prev] == 5.0 + prev), t
    h.barrier(channel=1)
    h.barrier()
    symm.free(h.signal_pad)
    dist.barrier()
