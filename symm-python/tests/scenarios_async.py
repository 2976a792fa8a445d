"""Asynchronous operations (``async_op=True``) from Python (run by worker.py as
``scenarios_async.<name>``): results as the blocking forms', several in flight, futures,
timeouts, errors from ``wait()``, and the check of tensors in flight (``SYMM_VALIDATE=1``).
"""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

import symm
from scenarios import ON_REFERENCE, expect
from scenarios_coll import bounded, data, symmetric_like


def wait(work):
    """Waits for a work and checks torch.distributed.Work's conventions on the way."""
    assert isinstance(work, symm.Work), work
    assert work.wait() is True
    assert work.is_completed() is True
    return work


def both_ways(call, *tensors):
    """Runs ``call(*copies, async_op)`` blocking and asynchronously on copies of ``tensors``;
    asserts that both leave the same bits and that the blocking form returns None."""
    plain = [t.clone() for t in tensors]
    assert call(*plain, False) is None
    started = [t.clone() for t in tensors]
    wait(call(*started, True))
    for p, s in zip(plain, started):
        assert torch.equal(p.view(torch.uint8), s.view(torch.uint8)), (call, p, s)
    return started


def every_call_as_the_blocking_form(rank, world, group=None, members=None):
    """Every collective and one-sided call with async_op=True leaves what the blocking form does."""
    members = members or list(range(world))
    n, me = len(members), members.index(rank)
    g = dict(group=group)
    for dt in (torch.float32, torch.bfloat16, torch.int64):
        for count, sym in [(37, False), (37, True), (70_000, False)]:
            t = data(me, count, dt)
            t = symmetric_like(t, group) if sym else t
            for op in ("sum", "max", 3):
                both_ways(lambda x, a, op=op: symm.shmem_allreduce(x, op, async_op=a, **g), t)
    # a low-precision transport, in place of the default
    both_ways(lambda x, a: symm.shmem_allreduce(x, "sum", group, "bfloat16", async_op=a), data(me, 999, torch.float32))
    for count in (5, 40_000):
        inp = data(me, count * n, torch.float32)
        both_ways(lambda o, i, a: symm.shmem_reduce_scatter(o, i, "avg", async_op=a, **g), torch.empty(count), inp)
        both_ways(
            lambda o, i, a: symm.shmem_allgather(o, i, async_op=a, **g), torch.empty(count * n, dtype=torch.int32),
            data(me, count, torch.int32),
        )
        root = count % n
        both_ways(
            lambda x, a, r=root: symm.shmem_broadcast(x, members[r] if group is None else r, async_op=a, **g),
            data(me, count, torch.float16),
        )
    # alltoall in each argument form: counts as a list, a tuple of tensors, one tensor
    sizes = [[(i + j) % 3 + 1 for j in range(n)] for i in range(n)]  # sizes[i][j]: i sends to j
    sends = [data(me, sizes[me][j], torch.float32, salt=j) for j in range(n)]
    recv_counts = [sizes[j][me] for j in range(n)]
    for counts in (recv_counts, tuple(torch.tensor([c]) for c in recv_counts), torch.tensor(recv_counts)):
        out = torch.full((sum(recv_counts) + 2,), -1.0)
        both_ways(lambda r, a, c=counts: symm.shmem_alltoall(sends, r, c, async_op=a, **g), out)
    # messages around the ring, and sendrecv both ways at once
    nxt, prv = (me + 1) % n, (me - 1) % n
    rank_of = (lambda r: members[r]) if group is None else (lambda r: r)
    msg = data(me, 300, torch.float64)
    for a in (False, True):
        got = torch.empty(300, dtype=torch.float64)
        if me % 2 == 0:
            w1 = symm.shmem_send(msg, rank_of(nxt), async_op=a, **g)
            w2 = symm.shmem_recv(got, rank_of(prv), async_op=a, **g)
        else:
            w1 = symm.shmem_recv(got, rank_of(prv), async_op=a, **g)
            w2 = symm.shmem_send(msg, rank_of(nxt), async_op=a, **g)
        if a:
            wait(w2), wait(w1)
        assert torch.equal(got, data(prv, 300, torch.float64)), (a, got)
    got = both_ways(lambda s, r, a: symm.shmem_sendrecv(s, rank_of(nxt), r, rank_of(prv), async_op=a, **g),
                    msg, torch.empty(300, dtype=torch.float64))
    assert torch.equal(got[1], data(prv, 300, torch.float64))


def one_sided_calls(rank, world):
    """shmem_put, shmem_get and shmem_put_with_signal with async_op=True: the data arrives as
    with the blocking forms; their futures hold ``[src]``."""
    peer = (rank + 1) % world
    buf = symm.empty(64, torch.float32)
    sig = symm.empty(world, torch.int64)
    buf.zero_(), sig.zero_()
    symm.barrier()
    src = torch.arange(64, dtype=torch.float32) + 100 * rank
    w = symm.shmem_put(buf, 8, src, 8, 16, peer, async_op=True)
    fut = w.get_future()
    wait(w)
    assert fut.wait()[0] is src
    symm.barrier()
    assert torch.equal(buf[8:24], torch.arange(8, 24, dtype=torch.float32) + 100 * ((rank - 1) % world)), buf
    local = torch.zeros(64)
    wait(symm.shmem_get(buf, 8, local, 0, 16, peer, async_op=True))
    blocking = torch.zeros(64)
    assert symm.shmem_get(buf, 8, blocking, 0, 16, peer) is None
    assert torch.equal(local, blocking) and torch.equal(local[:16], buf[8:24].new_tensor(
        (torch.arange(8, 24, dtype=torch.float32) + 100 * rank).tolist())), local
    symm.barrier()
    w = symm.shmem_put_with_signal(buf, 32, src, 0, 32, sig, rank, 7, "set", peer, async_op=True)
    got = symm.shmem_wait_for_signal(None, sig, (rank - 1) % world, 7, "eq")
    assert got == 7 and torch.equal(buf[32:], torch.arange(32, dtype=torch.float32) + 100 * ((rank - 1) % world)), buf
    wait(w)
    symm.barrier()


def results(rank, world):
    every_call_as_the_blocking_form(rank, world)
    # a group in another order than the world's
    members = list(reversed(range(world)))
    group = symm.create_group(members)
    every_call_as_the_blocking_form(rank, world, group, members)
    one_sided_calls(rank, world)


def in_flight(rank, world):
    """Several operations in flight at once, waited for in reverse order; futures; is_completed;
    a blocking call after asynchronous ones on the same group takes its turn after them."""
    k = 12
    ts = [data(rank, 1000 + i, torch.float32, salt=i) for i in range(k)]
    works = [symm.shmem_allreduce(t, async_op=True) for t in ts]
    outs = [torch.empty(world * 10) for _ in range(3)]
    works += [symm.shmem_allgather(o, data(rank, 10, torch.float32, salt=i), async_op=True) for i, o in enumerate(outs)]
    # a blocking allreduce issued behind them (it waits for this rank's stream work on the group)
    x = data(rank, 50, torch.float32, salt=99)
    symm.shmem_allreduce(x)
    assert torch.equal(x, sum(data(r, 50, torch.float32, salt=99) for r in range(world)))
    for w in reversed(works):
        wait(w)
    for i, t in enumerate(ts):
        assert torch.equal(t, sum(data(r, 1000 + i, torch.float32, salt=i) for r in range(world))), i
    for i, o in enumerate(outs):
        assert torch.equal(o, torch.cat([data(r, 10, torch.float32, salt=i) for r in range(world)])), i

    # futures: asked for before completion (the future thread completes them), after it, and
    # with a callback; their value is the list of output tensors
    ts = [data(rank, 2000, torch.float32, salt=i) for i in range(4)]
    works = [symm.shmem_allreduce(t, async_op=True) for t in ts]
    futs = [w.get_future() for w in works]
    assert works[0].get_future() is futs[0]
    chained = futs[-1].then(lambda f: f.value()[0].sum().item())
    for i, (f, t) in enumerate(zip(futs, ts)):
        value = f.wait()
        assert isinstance(value, list) and len(value) == 1 and value[0] is t, value
        assert f.done() and f.value()[0] is t
        assert torch.equal(t, sum(data(r, 2000, torch.float32, salt=i) for r in range(world))), i
    assert chained.wait() == ts[-1].sum().item()
    for w in works:
        assert w.is_completed() is True and w.wait() is True
    out = torch.empty(world * 3)
    w = symm.shmem_allgather(out, torch.full((3,), float(rank)), async_op=True)
    wait(w)
    assert w.get_future().value()[0] is out and w.get_future().done()
    # torch.distributed.Work's other methods, on a completed work
    w.synchronize()
    assert w.result()[0] is out and w.is_success() is True and w.exception() is None

    # is_completed becomes true without a wait
    t = torch.ones(100_000)
    w = symm.shmem_allreduce(t, async_op=True)
    deadline = time.monotonic() + 10
    while not w.is_completed():
        assert time.monotonic() < deadline, "is_completed() never became true"
        time.sleep(0.001)
    assert torch.equal(t, torch.full((100_000,), float(world)))
    assert "completed" in repr(w) and w.op == "allreduce", repr(w)
    # a work dropped unwaited: its tensors stay held until it completes, nothing is lost
    t = torch.ones(1000)
    symm.shmem_allreduce(t, async_op=True)
    symm.shmem_allreduce(x)  # ordered after it
    assert torch.equal(t, torch.full((1000,), float(world)))
    symm.barrier()


def timeouts(rank, world):
    """A wait that ends before its operation does raises Timeout naming the stream and leaves
    the operation in flight; an operation whose peer never joins fails with the blocking form's
    Timeout, from wait() and from its future."""
    symm.init()  # on both ranks before rank 1 waits in gloo
    t = torch.ones(16)
    if rank == 0:
        w = symm.shmem_allreduce(t, async_op=True)
        t0 = time.monotonic()
        e = expect(symm.Timeout, lambda: w.wait(timeout=0.3), "stream", "synchronize", rank=0)
        assert 0.25 < time.monotonic() - t0 < 3, time.monotonic() - t0
        assert "allreduce" in str(e), e
        expect(symm.Timeout, lambda: w.wait(timeout=datetime.timedelta(milliseconds=100)), "stream")
        assert w.is_completed() is False
        # in flight: no result yet (its tensors are the operation's), no error, not a success
        expect(symm.InvalidArgument, w.result, "in flight", rank=0)
        assert w.exception() is None and w.is_success() is False
        dist.barrier()  # now the peer joins
        wait(w)
    else:
        dist.barrier()
        symm.shmem_allreduce(t)
    assert torch.equal(t, torch.full((16,), float(world)))
    expect(symm.InvalidArgument, lambda: symm.shmem_allreduce(torch.ones(1), async_op=True).wait(timeout=-1), "timeout")
    symm.barrier()

    # rank 1 never joins this group's allreduce (SYMMETRIC_MEMORY_TIMEOUT is short here); a
    # group of its own, which the skipped call leaves out of step
    group = symm.create_group(list(reversed(range(world))))
    symm.shmem_allreduce(torch.ones(1), group=group)  # its workspace, allocated by every member
    if rank == 0:
        w = symm.shmem_allreduce(torch.ones(8), group=group, async_op=True)
        fut = w.get_future()
        t0 = time.monotonic()
        # (a bound longer than the operation's own: a wait of the default bound may end first)
        where = "in allreduce #" if ON_REFERENCE else "in allreduce (round"
        e = expect(symm.Timeout, lambda: w.wait(timeout=30), where, rank=0)
        assert "synchronize" not in str(e), e
        assert time.monotonic() - t0 < 20, time.monotonic() - t0
        # the same error every time, from is_completed and the future too
        assert str(expect(symm.Timeout, w.wait)) == str(e)
        assert str(expect(symm.Timeout, w.is_completed)) == str(e)
        assert str(expect(symm.Timeout, w.synchronize)) == str(e)
        assert str(expect(symm.Timeout, w.result)) == str(e)
        f = w.exception()
        assert isinstance(f, symm.Timeout) and str(f) == str(e) and w.is_success() is False, f
        try:
            fut.wait()
        except Exception as f:  # torch re-raises what was set, possibly wrapped
            assert str(e) in str(f), (f, e)
        else:
            raise AssertionError("the future of a failed work completed")
        # a failed stream is replaced once it has drained: later asynchronous calls work
        dist.barrier()
        t = torch.ones(4)
        wait(symm.shmem_allreduce(t, async_op=True))
    else:
        dist.barrier()
        t = torch.ones(4)
        wait(symm.shmem_allreduce(t, async_op=True))
    assert torch.equal(t, torch.full((4,), float(world)))


def errors(rank, world):
    """Argument errors of asynchronous calls: a rank refusing its own arguments raises at the
    call and its peers' wait() raises PeerRejected at once; a mismatch raises Mismatch from
    every member's wait(), as the blocking form; the group stays usable."""
    nc = torch.ones(4, 4).t()
    if rank == 0:
        expect(symm.InvalidArgument, lambda: symm.shmem_allreduce(nc, async_op=True), "tensor", "contiguous", rank=0)
    else:
        w = symm.shmem_allreduce(torch.ones(16), async_op=True)
        bounded(lambda: expect(symm.PeerRejected, w.wait, "global rank 0 rejected", rank=rank), limit=5)
    # the blocking form fails the same way
    if rank == 0:
        expect(symm.InvalidArgument, lambda: symm.shmem_allreduce(nc), "tensor", "contiguous", rank=0)
    else:
        blocking = bounded(lambda: expect(symm.PeerRejected, lambda: symm.shmem_allreduce(torch.ones(16)), rank=rank))
        assert type(blocking).__name__ == "PeerRejected"
    # a mismatch found by the collective itself, on the stream: every member's wait() raises
    w = symm.shmem_allreduce(torch.ones(4 + rank), async_op=True)
    async_error = bounded(lambda: expect(symm.Mismatch, w.wait, "allreduce", rank=rank))
    blocking_error = bounded(lambda: expect(symm.Mismatch, lambda: symm.shmem_allreduce(torch.ones(4 + rank))))
    assert str(async_error).split(":")[0] == str(blocking_error).split(":")[0], (async_error, blocking_error)
    # one-sided calls check their arguments at the call
    buf = symm.empty(8, torch.float32)
    expect(symm.InvalidArgument, lambda: symm.shmem_put(buf, 4, torch.ones(8), 0, 8, 0, async_op=True), "target_offset")
    expect(symm.InvalidArgument, lambda: symm.shmem_get(buf, 0, nc, 0, 4, 0, async_op=True), "src", "contiguous")
    # the group is usable afterwards, asynchronously and not
    t = torch.ones(8)
    wait(symm.shmem_allreduce(t, async_op=True))
    symm.shmem_allreduce(t)
    assert torch.equal(t, torch.full((8,), float(world * world)))
    symm.barrier()


def validate(rank, world):
    """SYMM_VALIDATE=1: an operation on a tensor overlapping one of an operation still in flight
    raises InvalidArgument naming both; a completed one's tensors are free again."""
    assert world == 2
    # symm starts at its first call, collectively: started here, so that in the first round
    # below rank 1's second of sleep keeps the allreduce in flight (started by that round's
    # first call instead, the start-up would pair the ranks and the allreduce could complete
    # before rank 0's refused call)
    symm.barrier()
    t = torch.ones(64)
    view = t[10:20]
    # each refused call rejects its round (after this rank's stream work on the group, which
    # is the allreduce in flight): one allreduce in flight for each
    refused = [
        (lambda: symm.shmem_allreduce(view), lambda: symm.shmem_allreduce(torch.ones(10)), "tensor"),
        (
            lambda: symm.shmem_allgather(torch.empty(20), view, async_op=True),
            lambda: symm.shmem_allgather(torch.empty(20), torch.ones(10)),
            "input_tensor",
        ),
        (
            lambda: symm.shmem_reduce_scatter(view[:5], torch.ones(10), async_op=True),
            lambda: symm.shmem_reduce_scatter(torch.ones(5), torch.ones(10)),
            "output_tensor",
        ),
    ]
    for mine, theirs, arg in refused:
        dist.barrier()
        if rank == 0:
            w = symm.shmem_allreduce(t, async_op=True)  # in flight until the peer joins, 1 s later
            e = expect(symm.InvalidArgument, mine, arg, "in flight", "asynchronous allreduce", rank=0)
            assert "overlaps tensor (64 x float32" in str(e), e
            wait(w)
        else:
            time.sleep(1.0)
            symm.shmem_allreduce(t)
            bounded(lambda theirs=theirs: expect(symm.PeerRejected, theirs))
    assert torch.equal(t, torch.full((64,), 8.0))
    # after wait() the tensor is the caller's again
    wait(symm.shmem_allreduce(t[10:20], async_op=True))
    # one-sided: a get into a tensor in flight, then a put from it
    buf = symm.empty(64, torch.float32)
    buf.fill_(float(rank))
    symm.barrier()
    local = torch.zeros(64)
    alone = symm.create_group([0])  # rank 0's own allocations: freeing one involves no peer
    dist.barrier()
    if rank == 0:
        mine = symm.empty(16, torch.float32, group=alone)
        # the gets wait on the stream behind an allreduce the peer joins later
        before = symm.shmem_allreduce(torch.ones(4), async_op=True)
        w = symm.shmem_get(buf, 0, local, 0, 64, 1, async_op=True)
        w2 = symm.shmem_get(buf, 0, mine, 0, 16, 1, async_op=True)
        expect(symm.InvalidArgument, lambda: symm.shmem_put(buf, 0, local[32:], 0, 8, 1), "src", "in flight", "get")
        expect(symm.InvalidArgument, lambda: symm.free(mine), "tensor", "in flight", "get", rank=0)
        wait(w), wait(before), wait(w2)
        assert torch.equal(local, torch.ones(64)) and torch.equal(mine, torch.ones(16))
        symm.shmem_put(buf, 0, local, 0, 8, 1)
        symm.free(mine)
    else:
        time.sleep(1.0)
        symm.shmem_allreduce(torch.ones(4))
    symm.barrier()
    # a completed operation releases its tensors even unwaited (seen at the next call)
    t = torch.ones(64)
    symm.shmem_allreduce(t, async_op=True)
    dist.barrier()
    time.sleep(1.0)
    symm.shmem_allreduce(t)
    assert torch.equal(t, torch.full((64,), 4.0))
    symm.barrier()
