"""What each rank of a multi-process test does (run by worker.py, one function per job).

Every function runs on every rank of the job; a failed assertion or an unexpected exception
fails the rank, and the harness reports the job with every rank's output.
"""

from __future__ import annotations

import ctypes
import datetime
import gc
import os
import sys
import threading
import time
import types

import torch
import torch.distributed as dist

import symm
from expect import expect  # the other scenario modules import it from here too

ALL_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
]

# Whether the collectives are the reference ones (SYMM_COLLECTIVES=reference): their small
# broadcasts are rounds like any other (no eager root), and their timeouts name the round's epoch.
ON_REFERENCE = os.environ.get("SYMM_COLLECTIVES", "").strip() == "reference"


def other_threads_run_while_waiting(rank, call, sync):
    """After ``sync()``, every rank runs ``call()``, rank 0 at once and its peers 0.6 s late;
    asserts that a thread of rank 0 kept running meanwhile (the call released the GIL while it
    waited for them)."""
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.01)

    th = threading.Thread(target=ticker)
    sync()
    if rank == 0:
        th.start()
        t0 = time.monotonic()
        call()
        waited = time.monotonic() - t0
        stop.set()
        th.join()
        assert waited > 0.3 and len(ticks) > 10, (waited, len(ticks))
    else:
        time.sleep(0.6)
        call()


def pattern(dtype, seed, n=8):
    """``n`` distinct values of ``dtype`` that depend on ``seed``."""
    base = torch.arange(n, dtype=torch.float32) + 10 * seed
    if dtype == torch.bool:
        return (torch.arange(n) + seed) % 3 == 0
    if dtype.is_floating_point:
        return (base / 4).to(dtype)
    return base.to(dtype)


def same_bits(a, b):
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def zero(t):
    # fill_/zero_ are not implemented for every dtype on CPU (float8); bytes always are.
    t.view(torch.uint8).zero_()


# --------------------------------------------------------------------------------------------
# world of 2 (FileStore): the primitives on the whole world
# --------------------------------------------------------------------------------------------


def freed_tensor_fails(rank, t, src, peer):
    """A tensor released by symm.free(): torch ops on it raise, symm calls name the argument."""
    for op in (lambda: t.fill_(1), lambda: t.sum(), lambda: t + 1, lambda: t.numel()):
        try:
            op()
        except RuntimeError as e:
            assert "released by symm.free()" in str(e), e
        else:
            raise AssertionError("a torch op on a freed symmetric tensor succeeded")
    assert "symm.free" in repr(t), repr(t)
    needle = "released by symm.free()"
    expect(symm.InvalidArgument, lambda: symm.shmem_put(t, 0, src, 0, 1, peer), "target", needle, rank=rank)
    expect(symm.InvalidArgument, lambda: symm.shmem_get(t, 0, src, 0, 1, peer), "target", needle, rank=rank)
    expect(symm.InvalidArgument, lambda: symm.shmem_put(src, 0, t, 0, 1, peer), needle, rank=rank)
    expect(symm.InvalidArgument, lambda: symm.free(t), "tensor", needle, rank=rank)
    expect(symm.InvalidArgument, lambda: symm.shmem_allreduce(t), "tensor", needle, rank=rank)
    expect(symm.InvalidArgument, lambda: symm.shmem_send(t, peer), "tensor", needle, rank=rank)
    assert not symm.is_symmetric(t)


def primitives(rank, world):
    assert not symm.is_initialized()
    peer, prev = (rank + 1) % world, (rank - 1) % world
    symm.init()
    usage0 = symm.memory_stats()

    # Every dtype: rows are written by element offset (rank * 8), so a byte unit would land
    # elsewhere; get reads a sub-range with both offsets non-zero.
    for dt in ALL_DTYPES:
        buf = symm.empty((world, 8), dt)
        assert buf.dtype == dt and tuple(buf.shape) == (world, 8), (buf.dtype, buf.shape)
        assert symm.is_symmetric(buf) and symm.is_symmetric(buf[1])
        zero(buf)
        symm.barrier()
        src = pattern(dt, rank)
        symm.shmem_put(buf, rank * 8, src, 0, 8, peer)
        symm.barrier()
        assert same_bits(buf[prev], pattern(dt, prev)), (dt, buf)
        assert not buf[rank].view(torch.uint8).any(), (dt, "own row untouched", buf)
        out = torch.empty(8, dtype=dt)
        zero(out)
        symm.shmem_get(buf, rank * 8 + 2, out, 1, 5, peer)  # my row on the peer = my src
        assert same_bits(out[1:6], src[2:7]), (dt, out, src)
        assert not out[:1].view(torch.uint8).any() and not out[6:].view(torch.uint8).any(), (dt, out)
        symm.barrier()
        symm.free(buf)
        if dt == ALL_DTYPES[0]:
            freed_tensor_fails(rank, buf, src, peer)

    # Shapes: ints, lists, torch.Size, 0-d; zero elements (agreed, nothing reserved).
    for shape, want in [(3, (3,)), ([2, 3], (2, 3)), (torch.Size([4, 1, 2]), (4, 1, 2)), ((), ())]:
        s = symm.empty(shape, torch.int16)
        assert tuple(s.shape) == want and s.dtype == torch.int16 and symm.is_symmetric(s), (shape, s.shape)
        symm.free(s)
    nothing = symm.empty((0, 5), torch.float32)
    assert tuple(nothing.shape) == (0, 5) and not symm.is_symmetric(nothing)
    symm.free(nothing)

    # Zero copy: plain torch ops on a symmetric tensor are what peers read.
    z = symm.empty(16, torch.float32)
    ptr = z.data_ptr()
    z.copy_(torch.full((16,), float(rank + 1)))
    z[3] = -1.0
    assert z.data_ptr() == ptr and symm.is_symmetric(z)
    symm.barrier()
    got = torch.zeros(16)
    symm.shmem_get(z, 0, got, 0, 16, peer)
    want = torch.full((16,), float(peer + 1))
    want[3] = -1.0
    assert torch.equal(got, want), got
    symm.barrier()

    # Views of a symmetric tensor are symmetric: a slice as the target, offsets as tensors, a
    # reinterpreting view.
    v = z[4:]
    symm.shmem_put(v, torch.tensor([2]), torch.tensor([100.0, 200.0]), torch.tensor(0), torch.tensor(2), peer)
    symm.barrier()
    assert z[6].item() == 100.0 and z[7].item() == 200.0, z
    zi = z.view(torch.int32)
    assert symm.is_symmetric(zi)
    symm.shmem_put(zi, 8, torch.tensor([7], dtype=torch.int32), 0, 1, peer)
    symm.barrier()
    assert z.view(torch.int32)[8].item() == 7
    symm.barrier()

    # Signals: set and add by name and by code; every compare op by name and by code; the
    # wait returns the value seen and does not consume it.
    sig = symm.empty(2 * world, torch.int64)
    sig.zero_()
    symm.barrier()
    symm.shmem_signal_op(sig, rank, 5, "set", peer)
    symm.shmem_signal_op(sig, rank, 3, 1, peer)
    symm.shmem_signal_op(sig, world + rank, 4, signal_op=0, target_rank=peer)
    # HyperParallel's codes: 0 eq, 1 gt, 2 lt, then 3 ne, 4 ge, 5 le.
    for op, value in [("eq", 8), (0, 8), ("ge", 8), (4, 7), ("gt", 7), (1, 7), ("le", 8), (5, 9), ("lt", 9), (2, 9)]:
        assert symm.shmem_wait_for_signal(None, sig, prev, value, op) == 8, (op, value)
    assert symm.shmem_wait_for_signal(z, sig, prev, 0, "ne") == 8
    assert symm.shmem_wait_for_signal(z, sig, prev, 0, 3) == 8
    assert symm.shmem_wait_for_signal(None, sig, world + prev, 4, "EQ", timeout=5) == 4
    assert symm.shmem_wait_for_signal(None, sig, world + prev, 4, "eq", timeout=datetime.timedelta(seconds=5)) == 4
    assert sig[prev].item() == 8, "waits do not reset the signal"
    t0 = time.monotonic()
    e = expect(symm.Timeout, lambda: symm.shmem_wait_for_signal(None, sig, prev, 9, "eq", timeout=0.3), "signal == 9")
    assert "last observed 8" in str(e) and isinstance(e, TimeoutError), e
    assert 0.25 < time.monotonic() - t0 < 5.0
    symm.barrier()

    # int32 signals, the value must fit.
    sig32 = symm.empty(world, torch.int32)
    sig32.zero_()
    symm.barrier()
    symm.shmem_signal_op(sig32, rank, 2**31 - 1, "set", peer)
    assert symm.shmem_wait_for_signal(None, sig32, prev, 2**31 - 1, "eq") == 2**31 - 1
    expect(symm.InvalidArgument, lambda: symm.shmem_signal_op(sig32, 0, 2**31, "set", peer), "signal_value", rank=rank)
    symm.barrier()

    # put_with_signal: whoever sees the signal sees the whole payload, iteration after
    # iteration (each round overwrites the previous one).
    n = 1 << 18
    data = symm.empty(n, torch.float32)
    flag = symm.empty(1, torch.int32)
    flag.zero_()
    symm.barrier()
    for it in range(1, 6):
        payload = torch.full((n,), float(it * 10 + rank))
        symm.shmem_put_with_signal(data, 0, payload, 0, n, flag, 0, it, "set", peer)
        assert symm.shmem_wait_for_signal(data, flag, 0, it, "ge") >= it
        assert torch.all(data == float(it * 10 + prev)), (it, data[:4], data[-4:])
        symm.barrier()  # the peer overwrites `data` only after this rank checked it

    # Blocking calls release the GIL: a thread of this process signals this rank while the
    # main thread waits (with the GIL held the thread could not run, and the wait would time out).
    own = symm.empty(1, torch.int64)
    own.zero_()
    symm.barrier()

    def later():
        time.sleep(0.2)
        symm.shmem_signal_op(own, 0, 42, "set", rank)

    th = threading.Thread(target=later)
    th.start()
    assert symm.shmem_wait_for_signal(None, own, 0, 42, "eq", timeout=10) == 42
    th.join()
    symm.barrier()

    # Collective sizes must agree: every member gets HeapError, and the heap stays usable.
    expect(symm.HeapError, lambda: symm.empty(8 if rank == 0 else 16, torch.float32), "size mismatch", rank=rank)
    again = symm.empty(8, torch.float32)
    symm.barrier()

    # Freed memory: using a view of it again is refused; the heap is back where it was.
    stale = again[2:]
    symm.free(again)
    expect(symm.InvalidArgument, lambda: symm.shmem_put(stale, 0, torch.zeros(1), 0, 1, peer), "no live allocation")
    for t in (z, sig, sig32, data, flag, own):
        symm.free(t)
    now = symm.memory_stats()
    figures = ("reserved", "in_use", "dropped", "allocations", "free")
    assert [now[k] for k in figures] == [usage0[k] for k in figures], (usage0, now)

    # A peer that exits while this rank waits on it: PeerLost, not a hang.
    last = symm.empty(1, torch.int64)
    last.zero_()
    symm.barrier()
    if rank == world - 1:
        print(f"SYMM-TEST-PASS rank {rank}", flush=True)
        os._exit(0)
    expect(symm.PeerLost, lambda: symm.shmem_wait_for_signal(None, last, 0, 1, "eq", timeout=20), "lost", rank=rank)


# --------------------------------------------------------------------------------------------
# world of 4 (TCPStore): groups in arbitrary order, rank mapping, DeviceMesh
# --------------------------------------------------------------------------------------------


def groups(rank, world):
    assert world == 4
    g31 = symm.create_group([3, 1])  # every rank calls (torch.distributed.new_group)
    if rank in (3, 1):
        assert dist.get_process_group_ranks(g31) == [3, 1], "create_group keeps the order given"
    # split_group takes ranks of the parent: parent rank i of [3, 2, 1, 0] is global 3 - i, so
    # parent ranks [3, 1, 0] are global [0, 2, 3] (in that order). Every member of the parent calls.
    reversed_world = symm.create_group([3, 2, 1, 0])
    g023 = symm.split_group(reversed_world, [3, 1, 0])
    if rank != 1:
        assert dist.get_process_group_ranks(g023) == [0, 2, 3], dist.get_process_group_ranks(g023)

    # [3, 1]: group rank 0 is global 3, group rank 1 is global 1.
    if rank in (3, 1):
        me, other = [3, 1].index(rank), 1 - [3, 1].index(rank)
        b = symm.empty(4, torch.int64, group=g31)
        b.fill_(-1)
        symm.barrier(group=g31)
        symm.shmem_put(b, 2 * me, torch.tensor([rank, 10 * rank]), 0, 2, other, group=g31)
        symm.barrier(group=g31)
        peer_global = [3, 1][other]
        assert b.tolist()[2 * other : 2 * other + 2] == [peer_global, 10 * peer_global], b
        out = torch.zeros(2, dtype=torch.int64)
        symm.shmem_get(b, 2 * me, out, 0, 2, other, group=g31)  # what I put there
        assert out.tolist() == [rank, 10 * rank], out
        expect(symm.GroupError, lambda: symm.shmem_put(b, 0, out, 0, 1, 2, group=g31), "target_rank = 2", "[3, 1]")
        # The buffer exists on 3 and 1 only: global rank 0 (group=None) is refused.
        expect(symm.GroupError, lambda: symm.shmem_put(b, 0, out, 0, 1, 0), "does not contain global rank 0")
        symm.barrier(group=g31)
        symm.free(b)
    else:
        expect(symm.GroupError, lambda: symm.empty(4, torch.int64, group=g31), "not a member", rank=rank)

    # [0, 2, 3] by split: a ring with put_with_signal, target ranks group-local.
    if rank in (0, 2, 3):
        members = [0, 2, 3]
        me = members.index(rank)
        nxt, prv = (me + 1) % 3, (me - 1) % 3
        data = symm.empty((3, 4), torch.float16, group=g023)
        sig = symm.empty(3, torch.int32, group=g023)
        sig.zero_()
        data.zero_()
        symm.barrier(group=g023)
        src = torch.full((4,), float(rank), dtype=torch.float16)
        symm.shmem_put_with_signal(data, 4 * me, src, 0, 4, sig, me, rank + 1, "set", nxt, group=g023)
        assert symm.shmem_wait_for_signal(data, sig, prv, members[prv] + 1, "eq", group=g023) == members[prv] + 1
        assert torch.all(data[prv] == float(members[prv])), data
        symm.shmem_signal_op(sig, me, 100, "add", target_rank=prv, group=g023)
        assert symm.shmem_wait_for_signal(None, sig, nxt, 100, "eq", group=g023) == 100  # added by nxt
        # The native group is built once per process group object.
        cache = symm._api._state.groups
        before = len(cache)
        symm.barrier(group=g023)
        symm.barrier(group=g023)
        assert len(cache) == before and cache[g023].ranks == [0, 2, 3], cache[g023]
        symm.free(data)
        symm.free(sig)
    else:
        expect(symm.GroupError, lambda: symm.barrier(group=g023), "not a member", rank=rank)

    # A DeviceMesh dimension is a process group like any other: columns are [0, 2] and [1, 3].
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2))
    col = mesh.get_group(0)
    col_ranks = dist.get_process_group_ranks(col)
    assert col_ranks == [rank % 2, rank % 2 + 2], col_ranks
    me = col_ranks.index(rank)
    c = symm.empty(2, torch.int32, group=col)
    c.zero_()
    symm.barrier(group=col)
    symm.shmem_put(c, me, torch.tensor([rank + 1], dtype=torch.int32), 0, 1, 1 - me, group=col)
    symm.barrier(group=col)
    assert c[1 - me].item() == col_ranks[1 - me] + 1, c
    symm.free(c)
    symm.barrier()


# --------------------------------------------------------------------------------------------
# world of 4 (FileStore): bad input from Python, every rank, no hang
# --------------------------------------------------------------------------------------------


def bad_input(rank, world):
    peer = (rank + 1) % world
    t = symm.empty(16, torch.float32)
    sig = symm.empty(4, torch.int32)
    sig.zero_()
    src = torch.arange(16, dtype=torch.float32)
    inv, grp = symm.InvalidArgument, symm.GroupError
    symm.barrier()

    # tensors
    expect(
        inv, lambda: symm.shmem_put(torch.zeros(16), 0, src, 0, 4, peer), "target", "not a symmetric tensor", rank=rank
    )
    expect(
        inv, lambda: symm.shmem_get(torch.zeros(16), 0, src, 0, 4, peer), "target", "not a symmetric tensor", rank=rank
    )
    expect(inv, lambda: symm.shmem_put(t, 0, src.view(4, 4).t(), 0, 4, peer), "src", "contiguous", "strides", rank=rank)
    expect(inv, lambda: symm.shmem_get(t, 0, src.view(4, 4).t(), 0, 4, peer), "src", "contiguous", rank=rank)
    expect(inv, lambda: symm.shmem_put(t.view(4, 4).t(), 0, src, 0, 4, peer), "target", "contiguous", rank=rank)
    expect(inv, lambda: symm.shmem_put(t, 0, src.double(), 0, 4, peer), "src", "float64", "float32", rank=rank)
    expect(inv, lambda: symm.shmem_get(t, 0, src.half(), 0, 4, peer), "src", "float16", rank=rank)
    expect(inv, lambda: symm.shmem_put(t, 0, [1.0, 2.0], 0, 2, peer), "src", "expected a torch tensor", rank=rank)
    expect(inv, lambda: symm.shmem_put(None, 0, src, 0, 2, peer), "target", rank=rank)
    # devices: npu says what it needs (torch_npu is not installed here), others are refused
    expect(symm.DeviceError, lambda: symm.empty(4, torch.float32, device="npu"), "npu", "torch_npu", rank=rank)
    expect(symm.DeviceError, lambda: symm.empty(4, torch.float32, device="npu:1"), "npu", "ascend.md", rank=rank)
    if "ascend" not in symm._symm.BACKENDS:
        # torch_npu loads (a stand-in module here) but this build has no Ascend backend: every
        # rank says how to build one, before any exchange.
        sys.modules["torch_npu"] = types.ModuleType("torch_npu")
        try:
            expect(symm.DeviceError, lambda: symm.empty(4, torch.float32, device="npu"), "--features ascend", rank=rank)
        finally:
            del sys.modules["torch_npu"]
    expect(inv, lambda: symm.empty(4, torch.float32, device="cuda:0"), "device", "cuda:0", "cpu or npu", rank=rank)
    expect(inv, lambda: symm.memory_stats(device="npu"), "device", "no npu tensors were used yet", rank=rank)
    # the stream event of interop: the CPU runs on no stream of the caller; npu needs its pieces
    expect(symm.Unsupported, lambda: symm.stream_event("cpu"), "complete on the host", rank=rank)
    expect(symm.DeviceError, lambda: symm.stream_event(), "npu", "torch_npu", rank=rank)
    expect(inv, lambda: symm.stream_event("cuda"), "device", "cpu or npu", rank=rank)
    assert symm.empty(4, torch.float32, device=torch.device("cpu")).device.type == "cpu"
    meta = torch.zeros(4, device="meta")
    expect(symm.Unsupported, lambda: symm.shmem_put(t, 0, meta, 0, 2, peer), "src", "meta", rank=rank)
    expect(inv, lambda: symm.shmem_put(t, 0, src.to_sparse(), 0, 2, peer), "src", "sparse", rank=rank)
    expect(
        inv,
        lambda: symm.shmem_put(t, 0, torch.zeros(2, dtype=torch.complex64), 0, 2, peer),
        "src",
        "complex64",
        rank=rank,
    )

    # offsets and sizes (elements)
    expect(inv, lambda: symm.shmem_put(t, 10, src, 0, 7, peer), "target_offset/size", "16", rank=rank)
    expect(inv, lambda: symm.shmem_put(t, 0, src, 12, 5, peer), "src_offset/size", rank=rank)
    expect(inv, lambda: symm.shmem_get(t, 0, src[:4], 0, 5, peer), "src_offset/size", rank=rank)
    expect(inv, lambda: symm.shmem_put(t, -1, src, 0, 1, peer), "target_offset = -1", rank=rank)
    expect(inv, lambda: symm.shmem_put(t, 0, src, 0, -2, peer), "size = -2", rank=rank)
    expect(inv, lambda: symm.shmem_put(t, 0, src, 1.5, 1, peer), "src_offset = 1.5", rank=rank)
    expect(inv, lambda: symm.shmem_put(t, 0, src, torch.tensor([0.5]), 1, peer), "src_offset", rank=rank)
    expect(inv, lambda: symm.shmem_put(t, "0", src, 0, 1, peer), "target_offset = '0'", rank=rank)

    # ranks
    expect(grp, lambda: symm.shmem_put(t, 0, src, 0, 1, world), f"target_rank = {world}", rank=rank)
    expect(grp, lambda: symm.shmem_get(t, 0, src, 0, 1, -1), "target_rank = -1", rank=rank)
    expect(grp, lambda: symm.shmem_signal_op(sig, 0, 1, "set", world + 3), f"target_rank = {world + 3}", rank=rank)

    # signals and op codes
    expect(inv, lambda: symm.shmem_signal_op(t, 0, 1, "set", peer), "signal", "int32 or int64", rank=rank)
    expect(
        inv,
        lambda: symm.shmem_signal_op(torch.zeros(4, dtype=torch.int32), 0, 1, "set", peer),
        "signal",
        "not a symmetric",
        rank=rank,
    )
    expect(inv, lambda: symm.shmem_signal_op(sig, 4, 1, "set", peer), "signal_offset", rank=rank)
    expect(inv, lambda: symm.shmem_signal_op(sig, 0, 1, "mul", peer), "signal_op", "mul", "0=set, 1=add", rank=rank)
    expect(inv, lambda: symm.shmem_signal_op(sig, 0, 1, 2, peer), "signal_op", rank=rank)
    expect(inv, lambda: symm.shmem_wait_for_signal(None, sig, 0, 0, "approx"), "compare_op", "approx", rank=rank)
    expect(inv, lambda: symm.shmem_wait_for_signal(None, sig, 0, 0, 6), "compare_op", "5=le", rank=rank)
    expect(inv, lambda: symm.shmem_wait_for_signal(None, sig, 0, 0, "eq", timeout=-1), "timeout", rank=rank)
    expect(inv, lambda: symm.shmem_wait_for_signal(None, sig, 0, 0, "eq", timeout=float("inf")), "timeout", rank=rank)
    expect(
        inv, lambda: symm.shmem_wait_for_signal(None, sig, 0, 0, "eq", timeout="soon"), "timeout = 'soon'", rank=rank
    )
    expect(inv, lambda: symm.shmem_wait_for_signal("x", sig, 0, 0, "eq"), "depend_tensor", rank=rank)
    expect(inv, lambda: symm.shmem_put_with_signal(t, 0, src, 0, 1, sig, 0, 1, "bogus", peer), "signal_op", rank=rank)

    # groups
    expect(grp, lambda: symm.barrier(group="not a group"), "group", "ProcessGroup", rank=rank)
    expect(grp, lambda: symm.create_group([0, 0]), "appears twice", rank=rank)
    expect(grp, lambda: symm.create_group([0, world]), "outside the world", rank=rank)
    expect(inv, lambda: symm.create_group(["a"]), "ranks", rank=rank)
    expect(grp, lambda: symm.split_group(None, [world]), "outside the parent", rank=rank)

    # allocation arguments (local: no peer is involved, so no rank waits)
    expect(inv, lambda: symm.empty((2, -3), torch.float32), "shape", "-3", rank=rank)
    expect(inv, lambda: symm.empty(("a", 2), torch.float32), "shape", rank=rank)
    expect(inv, lambda: symm.empty(4, torch.complex64), "dtype", "complex64", "bfloat16", rank=rank)
    expect(inv, lambda: symm.empty(4, "float128"), "dtype", "float128", rank=rank)
    expect(inv, lambda: symm.empty(4, 3.0), "dtype", rank=rank)
    expect(symm.HeapExhausted, lambda: symm.empty(1 << 40, torch.float32), "SYMMETRIC_MEMORY_HEAP_SIZE", rank=rank)
    expect(inv, lambda: symm.free(torch.zeros(3)), "tensor", "not a symmetric", rank=rank)

    # Nothing above moved data or broke the heap: a full round still works.
    symm.barrier()
    symm.shmem_put(t, 0, src, 0, 16, peer)
    symm.barrier()
    assert torch.equal(t, src)

    # One rank skips a collective: the others raise Timeout naming it, within the bound
    # (a group of its own, whose state the skipped call leaves out of step).
    lonely = symm.create_group([1, 0, 2, 3])
    symm.barrier(group=lonely)
    if rank != 3:
        t0 = time.monotonic()
        e = expect(symm.Timeout, lambda: symm.barrier(group=lonely), "barrier", "ranks not arrived: [3]", rank=rank)
        assert time.monotonic() - t0 < 10, e
    # One rank passes a bad argument to a collective: it fails at once, the others time out.
    other = symm.create_group([2, 3, 1, 0])
    if rank == 0:
        expect(inv, lambda: symm.empty(4, torch.complex64, group=other), "dtype", rank=rank)
    else:
        expect(symm.Timeout, lambda: symm.empty(4, torch.float32, group=other), "alloc", rank=rank)
    dist.barrier()


# --------------------------------------------------------------------------------------------
# world of 8 (FileStore)
# --------------------------------------------------------------------------------------------


def world8(rank, world):
    assert world == 8
    peer, prev = (rank + 1) % world, (rank - 1) % world
    ring = symm.empty((world, 32), torch.bfloat16)
    sig = symm.empty(world, torch.int64)
    sig.zero_()
    symm.barrier()
    src = torch.full((32,), float(rank), dtype=torch.bfloat16)
    symm.shmem_put_with_signal(ring, rank * 32, src, 0, 32, sig, rank, 1, "add", peer)
    symm.shmem_wait_for_signal(ring, sig, prev, 1, "eq")
    assert torch.all(ring[prev] == float(prev)), ring[prev]
    odd = symm.create_group([7, 5, 3, 1])
    if rank % 2:
        me = [7, 5, 3, 1].index(rank)
        acc = symm.empty(1, torch.int64, group=odd)
        acc.zero_()
        symm.barrier(group=odd)
        symm.shmem_signal_op(acc, 0, rank, "add", target_rank=0, group=odd)  # group rank 0 = global 7
        symm.barrier(group=odd)
        if me == 0:
            assert acc.item() == 7 + 5 + 3 + 1, acc
    symm.barrier()


# --------------------------------------------------------------------------------------------
# world of 4 on two "hosts" (SYMM_HOST_ID: ranks 0,1 on a, 2,3 on b)
# --------------------------------------------------------------------------------------------


def two_hosts(rank, world):
    node_a, node_b = symm.create_group([0, 1]), symm.create_group([2, 3])
    cross = symm.create_group([1, 2])
    # The world spans hosts: symmetric allocation is refused on every rank, at once (its
    # collectives and barrier run hierarchically: scenarios_hier.py).
    expect(symm.GroupError, lambda: symm.empty(4, torch.float32), "spans hosts", "host-a: ranks [0, 1]", rank=rank)
    symm.barrier()
    if rank in (1, 2):
        expect(
            symm.GroupError, lambda: symm.empty(4, torch.float32, group=cross), "spans hosts", "ranks [2]", rank=rank
        )
    # Each host's group works.
    node = node_a if rank < 2 else node_b
    me = rank % 2
    b = symm.empty(2, torch.int64, group=node)
    b.zero_()
    symm.barrier(group=node)
    symm.shmem_put(b, me, torch.tensor([rank]), 0, 1, 1 - me, group=node)
    symm.barrier(group=node)
    assert b[1 - me].item() == (rank ^ 1), b
    dist.barrier()


def per_node_init(rank, world):
    # Each "node" starts its own symm world; group=None then means the node.
    groups = [symm.create_group([0, 1]), symm.create_group([2, 3])]
    node = groups[rank // 2]
    symm.init(group=node)
    symm.init(group=node)  # idempotent for the same group
    expect(symm.InvalidArgument, lambda: symm.init(), "already initialised", rank=rank)
    b = symm.empty(2, torch.int64)
    b.zero_()
    symm.barrier()
    me = rank % 2
    symm.shmem_put(b, me, torch.tensor([100 + rank]), 0, 1, 1 - me)  # target_rank: a rank of the node
    symm.barrier()
    assert b[1 - me].item() == 100 + (rank ^ 1), b
    expect(symm.GroupError, lambda: symm.barrier(group=dist.group.WORLD), "outside the ranks symm was initialised for")
    expect(symm.GroupError, lambda: symm.shmem_put(b, 0, b, 0, 1, 2), "target_rank = 2", rank=me)
    dist.barrier()


# --------------------------------------------------------------------------------------------
# world of 2: start-up errors (heap sizes, bad settings), then a working start
# --------------------------------------------------------------------------------------------


def init_errors(rank, world):
    os.environ["SYMMETRIC_MEMORY_HEAP_SIZE"] = f"{rank + 1}M"
    expect(symm.HeapError, lambda: symm.init(), "heap size differs", rank=rank)
    os.environ["SYMMETRIC_MEMORY_HEAP_SIZE"] = "12Q"
    expect(symm.BootstrapError, lambda: symm.init(), "SYMMETRIC_MEMORY_HEAP_SIZE", "12Q", rank=rank)
    os.environ["SYMMETRIC_MEMORY_HEAP_SIZE"] = "2M"
    symm.init()
    assert symm._api._state.comm.heap_size == 2 << 20
    _alive = works(rank, world)  # held: heap_comes_back starts with no dropped tensor

    heap_comes_back(rank, world)


def works(rank, world):
    """A started symm moves data: each rank reads the next rank's symmetric tensor, which it
    returns."""
    t = symm.empty(4, torch.int32)
    t.fill_(rank)
    symm.barrier()
    out = torch.zeros(4, dtype=torch.int32)
    symm.shmem_get(t, 0, out, 0, 4, (rank + 1) % world)
    assert out.tolist() == [(rank + 1) % world] * 4, out
    symm.barrier()
    return t


def heap_comes_back(rank, world):
    """Symmetric tensors garbage-collected without free() come back once every member dropped
    them: a loop that allocates per iteration far more than the heap in all succeeds;
    memory_stats follows; frees of different allocations fail on every member."""
    size = 1 << 18  # 256 KiB of the 2 MiB heap, 10 MiB over the loop
    base = symm.memory_stats()
    assert base["dropped"] == 0 and base["reserved"] + base["free"] == base["heap_size"] == 2 << 20, base
    for i in range(40):
        t = symm.empty(size, torch.uint8)
        t.fill_(i % 256)
    s = symm.memory_stats()
    # Alive: the last one; dropped and waiting for the next allocation: the one before.
    assert (s["in_use"], s["dropped"]) == (base["in_use"] + size, size), (base, s)
    assert s["reserved"] == s["in_use"] + s["dropped"] and s["free"] == s["heap_size"] - s["reserved"], s
    assert 0 < s["largest_free"] <= s["free"], s
    world_key = tuple(range(world))
    assert s["groups"][world_key]["dropped"] == size, s
    del t
    symm.empty(0, torch.uint8)  # an allocation round of the world: reclaims both
    s = symm.memory_stats()
    assert [s[k] for k in ("reserved", "in_use", "dropped")] == [base[k] for k in ("reserved", "in_use", "dropped")]

    # Dropped by rank 0 only: stays reserved until rank 1 drops it too.
    held = symm.empty(size, torch.uint8)
    kept = held if rank != 0 else None
    del held
    symm.empty(0, torch.uint8)
    s = symm.memory_stats()
    assert s["dropped"] == (size if rank == 0 else 0) and s["reserved"] == base["reserved"] + size, (rank, s)
    del kept
    symm.empty(0, torch.uint8)
    s = symm.memory_stats()
    assert (s["reserved"], s["dropped"]) == (base["reserved"], 0), (rank, s)

    # Frees of different allocations: HeapError on every member, nothing freed.
    a = symm.empty(8, torch.float32)
    b = symm.empty(8, torch.float32)
    expect(symm.HeapError, lambda: symm.free(a if rank == 0 else b), "free mismatch", rank=rank)
    assert symm.is_symmetric(a) and symm.is_symmetric(b)
    symm.free(a)
    symm.free(b)
    symm.barrier()


def fork_after_init(rank, world):
    """A child of fork() cannot act as its parent's rank: its calls raise Unsupported, and
    neither dropping its copy of the communicator nor its normal exit (symm's atexit hook)
    marks the parent's rank closed or exited."""
    symm.init()
    symm.barrier()
    if rank == 0:
        for how in ("drop", "exit"):
            pid = os.fork()
            if pid == 0:
                code = 0
                calls = (
                    lambda: symm.shmem_allreduce(torch.ones(1)),
                    lambda: symm.barrier(),
                    lambda: symm.empty(4, torch.float32),
                )
                for call in calls:
                    try:
                        call()
                        code = 3
                    except symm.Unsupported as e:
                        if "fork()" not in str(e):
                            code = 4
                    except BaseException:  # noqa: BLE001 - any other outcome fails the test
                        code = 5
                if how == "drop":
                    symm._api._state = None  # drops the child's copy of the communicator
                    gc.collect()
                    os._exit(code)
                # exit(3) runs the C atexit hooks, symm's among them, with the communicator
                # open (Python's own finalisation would wait for the gloo threads the child
                # does not have).
                ctypes.CDLL(None).exit(code)
            _, status = os.waitpid(pid, 0)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"{how}: the child ended with {status:#x}"
    for _ in range(2):
        x = torch.tensor([float(rank + 1)])
        symm.shmem_allreduce(x)
        assert x.item() == 3.0, x
    symm.barrier()


def torchrun_basic(rank, world):
    assert os.environ.get("TORCHELASTIC_RUN_ID"), "not started by torchrun"
    t = symm.empty(world, torch.float32)
    t.zero_()
    symm.barrier()
    for peer in range(world):
        symm.shmem_put(t, rank, torch.tensor([float(rank + 1)]), 0, 1, peer)
    symm.barrier()
    assert t.tolist() == [float(r + 1) for r in range(world)], t
    symm.barrier()


def harness_self_check(rank, world):
    # Rank 1 fails; rank 0 passes. The harness must report the job as failed.
    if rank == 1:
        raise SystemExit(3)
