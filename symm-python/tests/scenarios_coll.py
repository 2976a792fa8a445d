"""Collectives, send/recv and bad input from Python (run by worker.py as ``scenarios_coll.<name>``).

Every rank can compute every other rank's input (``data(r, ...)``), so each rank checks its own
results against a reference built locally, exactly (the values are small integers, exact in
every dtype) except where a low-precision transport rounds.
"""

from __future__ import annotations

import time
from functools import partial

import torch
import torch.distributed as dist

import symm
from scenarios import ON_REFERENCE, expect, other_threads_run_while_waiting, same_bits, zero

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def data(r, n, dtype, salt=0):
    """Rank r's input: n small integers (exact in every dtype, sums of a few ranks too)."""
    if dtype in FP8:
        return data(r, n, torch.float32, salt).to(dtype)
    v = (torch.arange(n, dtype=torch.int64) * 7 + 3 * r + salt) % 11 - (0 if dtype == torch.uint8 else 5)
    if dtype == torch.bool:
        return v % 2 == 0
    return v.to(dtype)


def reduce_ref(inputs, op):
    x = torch.stack([t.double() for t in inputs])
    if op in ("sum", 0):
        return x.sum(0)
    if op in ("avg", 1):
        return x.sum(0) / len(inputs)
    if op in ("max", 2):
        return x.max(0).values
    return x.min(0).values


def everywhere_identical(t, group=None):
    """The tensor's bytes are the same on every member (checked with gloo)."""
    b = t.contiguous().view(torch.uint8).flatten()
    n = dist.get_world_size(group)
    out = [torch.empty_like(b) for _ in range(n)]
    dist.all_gather(out, b, group=group)
    return all(torch.equal(o, b) for o in out)


def symmetric_like(t, group=None):
    s = symm.empty(tuple(t.shape), t.dtype, group=group)
    s.copy_(t) if t.dtype not in FP8 else s.view(torch.uint8).copy_(t.view(torch.uint8))
    return s


def check_group(rank, world, group, members):
    """Every collective on ``group`` (global ranks ``members`` in group order)."""
    n = len(members)
    me = members.index(rank)

    # allreduce: every dtype and op, plain and symmetric tensors, a size above the one-shot
    # limit (256 KiB) and above the 1 MiB workspace (chunked); results bit-identical everywhere.
    for dt in FLOATS + INTS:
        for op in ["sum", "avg", "max", "min", 0, 2, 3]:
            if op == "avg" and not dt.is_floating_point:
                continue
            if op in ("sum", 0) and dt in (torch.int8, torch.uint8) and n > 2:
                continue  # may overflow the narrow type; the wrap-around is tested in Rust
            for count, sym in [(37, False), (37, True), (70_000, False)]:
                if count > 1000 and (dt not in (torch.float32, torch.int32) or op not in ("sum", "max")):
                    continue
                t = data(me, count, dt)
                t = symmetric_like(t, group) if sym else t
                symm.shmem_allreduce(t, op, group)
                want = reduce_ref([data(j, count, dt) for j in range(n)], op)
                got = t.double()
                tol = 1e-2 if dt in (torch.float16, torch.bfloat16) else 1e-6
                assert torch.allclose(got, want.to(dt).double(), atol=tol, rtol=tol), (dt, op, count, sym, got, want)
                assert everywhere_identical(t, group), (dt, op, count)
                if sym:
                    symm.free(t)

    # low precision: the format given as a dtype or by name gives the same bits; accumulation
    # is full precision, so the result is close to the full-precision one (not equal).
    x = data(me, 4096, torch.float32) * 0.37
    ref = x.clone()
    symm.shmem_allreduce(ref, "sum", group)
    outs = []
    for lp in [torch.bfloat16, "bfloat16", "bf16", "torch.bfloat16"]:
        t = x.clone()
        symm.shmem_allreduce(t, "sum", group, low_precision_dtype=lp)
        outs.append(t)
    assert all(torch.equal(o, outs[0]) for o in outs), "every spelling of the format gives the same result"
    assert not torch.equal(outs[0], ref) and torch.allclose(outs[0], ref, rtol=2e-2, atol=2e-2), (outs[0], ref)
    if group is None:
        # (The default format, SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE, is read by symm.init:
        # scenarios_config.) A rotation of the world is a new native group.
        lp_group = symm.create_group(list(range(1, world)) + [0])
        # Integers keep full precision.
        counts = data(me, 300, torch.int64) * 1_000_003
        symm.shmem_allreduce(counts, "sum", lp_group)
        want = sum(data(j, 300, torch.int64) * 1_000_003 for j in range(world))
        assert torch.equal(counts, want), (counts, want)
        # "none": full precision whatever the default (a loss, a metric).
        t = x.clone()
        symm.shmem_allreduce(t, "sum", lp_group, low_precision_dtype="none")
        # (lp_group adds in another rank order than the world: equal up to f32 rounding.)
        assert torch.allclose(t, ref, rtol=1e-6, atol=1e-6) and not torch.equal(t, outs[0]), "full precision"
        bad = data(me, 8, torch.int64)
        explicit = partial(symm.shmem_allreduce, bad, "sum", lp_group, low_precision_dtype=torch.bfloat16)
        expect(symm.InvalidArgument, explicit, "low_precision_dtype", "int64")
        t = x.clone()
        symm.shmem_allreduce(t, "sum", lp_group, low_precision_dtype=torch.bfloat16)
        assert torch.equal(t, outs[0])
    for lp in [torch.float16, torch.float8_e4m3fn, "float8_e5m2"]:
        t = data(me, 1000, torch.float32)
        symm.shmem_allreduce(t, "sum", group, lp)
        assert torch.allclose(t.double(), reduce_ref([data(j, 1000, torch.float32) for j in range(n)], "sum"), atol=0.6)
        rs = torch.empty(100)
        symm.shmem_reduce_scatter(rs, data(me, 100 * n, torch.float32), "avg", group, lp)

    # reduce_scatter: part r of the inputs, reduced, lands on group rank r; in place (output =
    # own part of the input) and symmetric inputs.
    for dt in [torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.int64]:
        for op in ["sum", "max", "min"] + (["avg"] if dt.is_floating_point else []):
            for count, mode in [(5, "plain"), (5, "inplace"), (5, "symmetric"), (40_000, "plain")]:
                inp = data(me, count * n, dt, salt=1)
                if mode == "symmetric":
                    inp = symmetric_like(inp, group)
                if mode == "inplace":
                    out = inp[me * count : (me + 1) * count]
                else:
                    out = torch.empty(count, dtype=dt)
                symm.shmem_reduce_scatter(out, inp, op, group)
                full = reduce_ref([data(j, count * n, dt, salt=1) for j in range(n)], op)
                want = full[me * count : (me + 1) * count]
                assert torch.allclose(out.double(), want.to(dt).double(), atol=1e-2), (dt, op, count, mode)
                if mode == "symmetric":
                    symm.free(inp)

    # allgather: every dtype (bool and fp8 included: it only moves bytes), in place and symmetric.
    for dt in FLOATS + INTS + [torch.bool, *FP8]:
        for count, mode in [(6, "plain"), (6, "inplace"), (6, "symmetric"), (50_000, "plain")]:
            if count > 1000 and dt not in (torch.float32, torch.uint8):
                continue
            src = data(me, count, dt)
            if mode == "inplace":
                out = torch.empty(n * count, dtype=dt)
                zero(out)
                out[me * count : (me + 1) * count].view(torch.uint8).copy_(src.view(torch.uint8))
                inp = out[me * count : (me + 1) * count]
            else:
                out = torch.empty((n, count), dtype=dt)
                inp = symmetric_like(src, group) if mode == "symmetric" else src
            symm.shmem_allgather(out, inp, group)
            for j in range(n):
                want = data(j, count, dt)
                assert same_bits(out.view(n, count)[j], want), (dt, mode, j)
            if mode == "symmetric":
                symm.free(inp)

    # alltoall: rank i sends (i + j) % n + 1 elements to rank j (sizes differ per pair);
    # receive_list as a list and as a tensor; a longer receive tensor keeps its tail.
    def sent(i, j):
        return torch.full(((i + j) % n + 1,), float(100 * i + j))

    for form in ["list", "tensor", "symmetric"]:
        sends = [sent(me, j) for j in range(n)]
        if form == "symmetric":
            # one allocation (same size everywhere), its rows' prefixes as the send tensors
            block = symm.empty((n, n), torch.float32, group=group)
            for j, s in enumerate(sends):
                block[j, : s.numel()] = s
            sends = [block[j, : s.numel()] for j, s in enumerate(sends)]
            assert all(symm.is_symmetric(s) for s in sends)
        counts = [(j + me) % n + 1 for j in range(n)]
        recv = torch.full((sum(counts) + 3,), -1.0)
        symm.shmem_alltoall(sends, recv, counts if form != "tensor" else torch.tensor(counts), group)
        want = torch.cat([sent(j, me) for j in range(n)] + [torch.full((3,), -1.0)])
        assert torch.equal(recv, want), (form, recv, want)
        if form == "symmetric":
            symm.free(block)
    # empty segments
    recv = torch.zeros(1)
    counts = [1 if j == me else 0 for j in range(n)]
    symm.shmem_alltoall(
        [torch.tensor([float(me)]) if j == me else torch.empty(0) for j in range(n)], recv, counts, group
    )
    assert recv.item() == float(me)

    # broadcast from every group rank, plain and symmetric.
    for src in range(n):
        t = data(me, 33, torch.float32)
        symm.shmem_broadcast(t, src, group)
        assert torch.equal(t, data(src, 33, torch.float32)), (src, t)
        s = symmetric_like(data(me, 100_000, torch.int64), group)
        symm.shmem_broadcast(s, torch.tensor(src), group)
        assert torch.equal(s, data(src, 100_000, torch.int64))
        symm.free(s)

    # send/recv: a ring in both directions, two messages in order, then a large message
    # (streamed: even group ranks send first, odd ones receive first).
    nxt, prv = (me + 1) % n, (me - 1) % n
    for k in range(2):
        symm.shmem_send(data(me, 10 + k, torch.float64), nxt, group)
    for k in range(2):
        got = torch.empty(10 + k, dtype=torch.float64)
        symm.shmem_recv(got, prv, group)
        assert torch.equal(got, data(prv, 10 + k, torch.float64)), (k, got)
    big = 1 << 20
    mine = data(me, big, torch.float32)
    got = torch.empty(big)
    if me % 2 == 0:
        symm.shmem_send(mine, nxt, group)
        symm.shmem_recv(got, prv, group)
    else:
        symm.shmem_recv(got, prv, group)
        symm.shmem_send(mine, nxt, group)
    assert torch.equal(got, data(prv, big, torch.float32))
    # sendrecv: both directions at once, so a ring needs no ordering at any size; its messages
    # pair with send/recv too (here: a sendrecv's message taken by recv, then the reverse).
    for count in [3, big]:
        got = torch.empty(count)
        symm.shmem_sendrecv(data(me, count, torch.float32), nxt, got, prv, group)
        assert torch.equal(got, data(prv, count, torch.float32)), count
    # Every rank sends 5 then 6 elements to the next and receives them from the previous, mixing
    # the calls (small messages are buffered, so no order is needed).
    s5, s6 = data(me, 5, torch.int32), data(me, 6, torch.int32)
    r5, r6 = torch.empty(5, dtype=torch.int32), torch.empty(6, dtype=torch.int32)
    if me % 2 == 0:
        symm.shmem_sendrecv(s5, nxt, r5, prv, group)
        symm.shmem_send(s6, nxt, group)
        symm.shmem_recv(r6, prv, group)
    else:
        symm.shmem_recv(r5, prv, group)
        symm.shmem_sendrecv(s5, nxt, r6, prv, group)
        symm.shmem_send(s6, nxt, group)
    assert torch.equal(r5, data(prv, 5, torch.int32)) and torch.equal(r6, data(prv, 6, torch.int32)), (r5, r6)


def collectives(rank, world):
    # The world, then a group whose group ranks differ from the global ranks.
    check_group(rank, world, None, list(range(world)))
    rev = list(reversed(range(world)))
    g = symm.create_group(rev)
    check_group(rank, world, g, rev)
    # A sub-group of half the ranks, in a scrambled order; the others do not take part.
    sub = [world - 1, 0] if world > 2 else [1, 0]
    gs = symm.create_group(sub)
    if rank in sub:
        check_group(rank, world, gs, sub)

    # Blocking collectives release the GIL: a thread keeps running while this rank waits in
    # an allreduce for a late peer.
    other_threads_run_while_waiting(rank, lambda: symm.shmem_allreduce(torch.ones(8)), symm.barrier)
    dist.barrier()


# --------------------------------------------------------------------------------------------
# bad input: every rank raises the right class naming the argument, nobody hangs, the groups
# stay usable
# --------------------------------------------------------------------------------------------


def bounded(fn, limit=8.0):
    t0 = time.monotonic()
    out = fn()
    took = time.monotonic() - t0
    assert took < limit, f"took {took:.1f} s"
    return out


def coll_bad_input(rank, world):
    n = world
    inv, grp, mis = symm.InvalidArgument, symm.GroupError, symm.Mismatch
    x = torch.ones(4)
    nc = torch.ones(4, 4).t()  # non-contiguous
    t0 = time.monotonic()

    def every(cls, fn, *needles):
        """All ranks make the same mistake: each raises ``cls`` at once."""
        return bounded(lambda: expect(cls, fn, *needles, rank=rank))

    # shapes
    every(inv, lambda: symm.shmem_allgather(torch.empty(4 * n - 1), x), "output_tensor", f"group size {n} x")
    every(inv, lambda: symm.shmem_allgather(torch.empty(4), x), "output_tensor = 4 elements")
    every(inv, lambda: symm.shmem_reduce_scatter(torch.empty(3), torch.ones(4 * n)), "input_tensor", "group size")
    every(inv, lambda: symm.shmem_reduce_scatter(torch.empty(4), torch.ones(4)), "input_tensor = 4 elements")
    # dtypes
    every(inv, lambda: symm.shmem_allgather(torch.empty(4 * n, dtype=torch.float64), x), "output_tensor", "float64")
    every(inv, lambda: symm.shmem_reduce_scatter(torch.empty(4, dtype=torch.int32), torch.ones(4 * n)), "output_tensor")
    every(
        inv,
        lambda: symm.shmem_alltoall(
            [torch.ones(1)] * (n - 1) + [torch.ones(1, dtype=torch.int64)], torch.ones(n), [1] * n
        ),
        "send_tensor_list",
        "int64",
        f"entry {n - 1}",
    )
    every(inv, lambda: symm.shmem_allreduce(torch.ones(4, dtype=torch.complex64)), "tensor", "complex64")
    # non-contiguous
    every(inv, lambda: symm.shmem_allreduce(nc), "tensor", "strides", "contiguous")
    every(inv, lambda: symm.shmem_allgather(torch.empty(4, 4 * n).t(), torch.ones(4, 4)), "output_tensor", "contiguous")
    every(inv, lambda: symm.shmem_allgather(torch.empty(16 * n), nc), "input_tensor", "contiguous")
    every(inv, lambda: symm.shmem_reduce_scatter(torch.empty(4, 4).t(), torch.ones(16 * n)), "output_tensor")
    every(inv, lambda: symm.shmem_broadcast(nc, 0), "tensor", "contiguous")
    every(
        inv,
        lambda: symm.shmem_alltoall([torch.ones(1)] * (n - 1) + [nc], torch.ones(n + 15), [1] * (n - 1) + [16]),
        "send_tensor_list",
        f"entry {n - 1}",
        "contiguous",
    )
    every(inv, lambda: symm.shmem_alltoall([torch.ones(1)] * n, torch.ones(n, 2).t(), [1] * n), "receive_tensor")
    every(inv, lambda: symm.shmem_send(nc, (rank + 1) % n), "tensor", "contiguous")
    every(inv, lambda: symm.shmem_recv(nc, (rank + 1) % n), "tensor", "contiguous")
    every(inv, lambda: symm.shmem_sendrecv(nc, 0, torch.ones(16), 0), "send_tensor", "contiguous")
    every(inv, lambda: symm.shmem_sendrecv(torch.ones(16), 0, nc, 0), "recv_tensor", "contiguous")
    both = torch.zeros(8)
    every(inv, lambda: symm.shmem_sendrecv(both[:5], 0, both[4:], 0), "recv_tensor", "overlap send_tensor")
    every(inv, lambda: symm.shmem_allreduce([1.0, 2.0]), "tensor", "expected a torch tensor")
    every(inv, lambda: symm.shmem_alltoall(torch.ones(n), torch.ones(n), [1] * n), "send_tensor_list", "list")
    every(
        inv,
        lambda: symm.shmem_alltoall([torch.ones(1), 3] + [torch.ones(1)] * (n - 2), torch.ones(n), [1] * n),
        "entry 1",
    )
    # alltoall lists
    every(
        inv,
        lambda: symm.shmem_alltoall([torch.ones(1)] * (n + 1), torch.ones(n), [1] * n),
        "send_tensor_list",
        f"({n})",
    )
    every(inv, lambda: symm.shmem_alltoall([torch.ones(1)] * n, torch.ones(n), [1] * (n - 1)), "receive_list")
    every(
        inv, lambda: symm.shmem_alltoall([torch.ones(1)] * n, torch.ones(n), [1] * (n - 1) + [-1]), "receive_list", "-1"
    )
    every(inv, lambda: symm.shmem_alltoall([torch.ones(1)] * n, torch.ones(n), [2] * n), "receive_list", "sums to")
    every(inv, lambda: symm.shmem_alltoall([torch.ones(1)] * n, torch.ones(n), 5), "receive_list")
    every(inv, lambda: symm.shmem_alltoall([torch.ones(1)] * n, torch.ones(n), [1.5] * n), "receive_list", "1.5")
    # ops and low-precision formats
    every(inv, lambda: symm.shmem_allreduce(x, "mul"), "op = 'mul'", "0=sum, 1=avg, 2=max, 3=min")
    every(inv, lambda: symm.shmem_allreduce(x, 7), "op = 7")
    every(inv, lambda: symm.shmem_reduce_scatter(torch.empty(1), torch.ones(n), "prod"), "op = 'prod'")
    every(inv, lambda: symm.shmem_allreduce(torch.ones(4, dtype=torch.int32), "avg"), "op", "avg", "int32")
    every(inv, lambda: symm.shmem_allreduce(x, low_precision_dtype="fp33"), "low_precision_dtype = 'fp33'", "bfloat16")
    every(inv, lambda: symm.shmem_allreduce(x, low_precision_dtype=torch.float32), "low_precision_dtype", "float32")
    every(inv, lambda: symm.shmem_allreduce(x, low_precision_dtype=3.5), "low_precision_dtype = 3.5")
    every(
        inv,
        lambda: symm.shmem_reduce_scatter(torch.empty(1), torch.ones(n), "sum", None, "int8"),
        "low_precision_dtype",
    )
    every(
        inv,
        lambda: symm.shmem_allreduce(torch.ones(4, dtype=torch.int64), low_precision_dtype=torch.bfloat16),
        "low_precision_dtype",
        "int64",
    )
    # (a bad default format is refused by symm.init: scenarios_config)
    # ranks
    every(grp, lambda: symm.shmem_broadcast(x, n), f"src_rank = {n}", f"group of {n} ranks")
    every(grp, lambda: symm.shmem_broadcast(x, -1), "src_rank = -1")
    every(inv, lambda: symm.shmem_broadcast(x, "zero"), "src_rank = 'zero'")
    every(grp, lambda: symm.shmem_send(x, n), f"dst_rank = {n}")
    every(grp, lambda: symm.shmem_recv(x, -2), "src_rank = -2")
    every(grp, lambda: symm.shmem_sendrecv(x, n, torch.empty(2), 0), f"dst_rank = {n}")
    every(grp, lambda: symm.shmem_sendrecv(x, 0, torch.empty(2), -2), "src_rank = -2")
    # Nothing above left a group out of step: a full round works.
    t = torch.full((4,), float(rank))
    symm.shmem_allreduce(t)
    assert t.tolist() == [float(sum(range(n)))] * 4, t

    # Non-members: a group of ranks 0 and 1; the others call into it.
    g01 = symm.create_group([0, 1])
    if rank >= 2:
        every(grp, lambda: symm.shmem_allreduce(x, group=g01), "not a member")
        every(grp, lambda: symm.shmem_send(x, 0, group=g01), "not a member")
        every(grp, lambda: symm.shmem_allgather(torch.empty(8), x, group=g01), "not a member")
    else:
        t = torch.ones(3)
        symm.shmem_allreduce(t, group=g01)
        assert t.tolist() == [2.0] * 3
        # group ranks of g01 are 0 and 1: 2 is out of range there, though a global rank
        every(grp, lambda: symm.shmem_broadcast(x, 2, group=g01), "src_rank = 2", "group of 2 ranks")

    # Sizes, dtypes, ops, roots that differ between ranks: Mismatch on every rank, at once.
    def mismatch(fn, *needles):
        return every(mis, fn, "differ" if not needles else needles[0], *needles[1:])

    mismatch(lambda: symm.shmem_allreduce(torch.ones(4 + rank)))
    mismatch(lambda: symm.shmem_allreduce(torch.ones(4, dtype=torch.float32 if rank else torch.float64)))
    mismatch(lambda: symm.shmem_allreduce(torch.ones(4), "sum" if rank else "max"))
    mismatch(lambda: symm.shmem_allreduce(torch.ones(64), low_precision_dtype=None if rank else "bfloat16"))
    mismatch(lambda: symm.shmem_allgather(torch.empty(n * (2 + rank)), torch.ones(2 + rank)))
    mismatch(lambda: symm.shmem_reduce_scatter(torch.empty(1 + rank), torch.ones(n * (1 + rank))))
    mismatch(lambda: symm.shmem_broadcast(torch.ones(4), 0 if rank else 1))
    # alltoall: every rank expects one element more from each peer than the peer sends
    mismatch(
        lambda: symm.shmem_alltoall([torch.ones(1)] * n, torch.ones(3 * n), [1 if j == rank else 2 for j in range(n)]),
        "recv_counts",
    )
    # recv of the wrong size: the receiver gets Mismatch naming both sizes; the pair stays usable
    if rank == 0:
        symm.shmem_send(torch.ones(5), 1)
        symm.shmem_send(torch.ones(3), 1)
    elif rank == 1:
        every(mis, lambda: symm.shmem_recv(torch.empty(4), 0), "recv of 4 elements", "20 bytes")
        got = torch.empty(3)
        symm.shmem_recv(got, 0)
        assert got.tolist() == [1.0] * 3
    # the same through sendrecv, whose send completes before the receive's Mismatch is raised
    if rank < 2:
        other = 1 - rank
        got = torch.empty(4 if rank == 1 else 2)
        if rank == 1:
            every(mis, lambda: symm.shmem_sendrecv(torch.ones(2), other, got, other), "recv of 4 elements")
        else:
            symm.shmem_sendrecv(torch.ones(6), other, got, other)
            assert got.tolist() == [1.0] * 2, got
    t = torch.full((2,), 1.0)
    symm.shmem_allreduce(t)
    assert t.tolist() == [float(n)] * 2, "the world is usable after the mismatches"

    # One rank with a bad argument, the others fine: it raises InvalidArgument, the others
    # PeerRejected (not a Timeout), and the group stays usable. A small broadcast's source does
    # not wait for the others: there the valid ranks complete the broadcast among themselves.
    for bad in [
        lambda: symm.shmem_allreduce(nc),
        lambda: symm.shmem_allgather(torch.empty(3), torch.ones(4)),
        lambda: symm.shmem_alltoall([torch.ones(1)] * n, torch.ones(n), [1] * (n - 1) + ["x"]),
        lambda: symm.shmem_reduce_scatter(torch.empty(1), torch.ones(n), "mul"),
        lambda: symm.shmem_broadcast(x.clone(), n + 5),
    ]:
        if rank == 1:
            e = bounded(lambda bad=bad: expect(symm.SymmError, bad, rank=rank))
            assert isinstance(e, (inv, grp)), e
        else:
            # the good ranks call the same collective with valid arguments
            good = good_call(bad, n)
            if "shmem_broadcast" in bad.__code__.co_names and not ON_REFERENCE:
                bounded(good)
            else:
                bounded(lambda good=good: expect(symm.PeerRejected, good, "global rank 1 rejected", rank=rank))
    t = torch.full((2,), 2.0)
    symm.shmem_allreduce(t)
    assert t.tolist() == [2.0 * n] * 2

    # A rank that never comes: the others time out (SYMMETRIC_MEMORY_TIMEOUT = 3 s) naming it,
    # in a group of their own (the skipped call leaves that group out of step).
    lonely = symm.create_group([1, 0] + list(range(2, n)))
    symm.shmem_allreduce(torch.ones(1), group=lonely)
    if rank != n - 1:
        t1 = time.monotonic()
        e = expect(symm.Timeout, lambda: symm.shmem_allgather(torch.empty(n), torch.ones(1), group=lonely), rank=rank)
        assert time.monotonic() - t1 < 10, e
        assert str(n - 1) in str(e), e
    assert time.monotonic() - t0 < 60
    dist.barrier()


def good_call(bad, n):
    """The valid call matching one of coll_bad_input's bad calls."""
    code = bad.__code__.co_names
    if "shmem_allgather" in code:
        return lambda: symm.shmem_allgather(torch.empty(4 * n), torch.ones(4))
    if "shmem_alltoall" in code:
        return lambda: symm.shmem_alltoall([torch.ones(1)] * n, torch.ones(n), [1] * n)
    if "shmem_reduce_scatter" in code:
        return lambda: symm.shmem_reduce_scatter(torch.empty(1), torch.ones(n), "sum")
    if "shmem_broadcast" in code:
        return lambda: symm.shmem_broadcast(torch.ones(4), 0)
    return lambda: symm.shmem_allreduce(torch.ones(16))
