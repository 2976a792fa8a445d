"""The two arms of the public collectives (src/ops.rs), on real ranks (run by worker.py as
``scenarios_fast.<name>``): which calls the fast arm takes, that its results and errors are the
full arm's bit for bit, and that every other call gets the full arm's conversions, errors,
rejections and profiler ranges.

Which arm a call took is seen by counting the calls of ``symm._api._current``, which the full
arm starts with and the fast arm never calls. A call with tensors of a subclass (``full``)
always takes the full arm: the fast arm reads tensors of the exact types only.
"""

from __future__ import annotations

import inspect
import os
import time
from functools import partial

import torch
import torch.distributed as dist

import symm
from scenarios import ON_REFERENCE, expect, other_threads_run_while_waiting, same_bits
from scenarios_coll import symmetric_like
from symm import _api, _symm


class FullPath:
    """Counts the calls that take the full arm while active."""

    def __enter__(self) -> "FullPath":
        self.calls, self.inner = 0, _api._current

        def counting():
            self.calls += 1
            return self.inner()

        _api._current = counting
        return self

    def __exit__(self, *exc) -> None:
        _api._current = self.inner


def takes(path, fn, *args, **kwargs):
    """Runs ``fn(*args, **kwargs)`` and asserts that it took ``path`` ("fast" or "full"); returns
    what it returned (an exception it raised propagates)."""
    with FullPath() as full:
        try:
            return fn(*args, **kwargs)
        finally:
            want = 0 if path == "fast" else 1
            assert full.calls == want, f"expected the {path} arm, the full arm ran {full.calls} times"


def raises(exc, fn, *args):
    """Runs ``fn(*args)``; asserts that it raises ``exc`` (a class or a tuple of classes)."""
    try:
        fn(*args)
    except exc:
        return
    raise AssertionError(f"{fn!r}{args}: expected {exc}")


class Slow(torch.Tensor):
    """A tensor subclass, which the fast arm does not read."""


def full(fn, first, *args, **kwargs):
    """``fn`` called on the full arm: its first argument (a tensor, or a list of tensors) passed
    as ``Slow`` views of the same memory, the others as given."""
    many = isinstance(first, (list, tuple))
    slow = type(first)(t.as_subclass(Slow) for t in first) if many else first.as_subclass(Slow)
    return takes("full", fn, slow, *args, **kwargs)


def values(rank, count, dtype, salt):
    """Random values of this rank: floats with many significant bits (so that a different
    order or precision of the reduction would show), small integers for integer dtypes."""
    g = torch.Generator().manual_seed(1000 * salt + rank)
    if dtype.is_floating_point:
        return (torch.randn(count, generator=g, dtype=torch.float64) * 3).to(dtype)
    return torch.randint(0, 9, (count,), generator=g, dtype=torch.int64).to(dtype)


def read_tensors_as(reader):
    """Makes the fast path read tensors as ``reader`` says (before symm.init): "handle" as it
    would; "shim" forces the fallback where the at::Tensor is not looked for in the tensor
    object (the shim reads the address `_cdata` gives), "descriptors" the fallback of a torch
    without the C shim."""
    import symm.platform.torch as torch_platform

    if reader == "shim":
        c_shim = torch_platform._c_shim

        def without_in_object(names):
            shim = c_shim(names)
            assert shim is not None and shim.pop("tensor_in_object") is True, shim
            return shim

        torch_platform._c_shim = without_in_object
    elif reader == "descriptors":
        torch_platform._c_shim = lambda names: None


def fast_path(rank, world):
    # SYMM_TEST_FAST_READER: how the fast path must read tensors here.
    reader = os.environ["SYMM_TEST_FAST_READER"]
    read_tensors_as(reader)

    # Before init the public function takes the full path, which starts symm.
    assert not symm.is_initialized()
    t = torch.full((4,), float(rank + 1))
    takes("full", symm.shmem_allreduce, t)
    assert symm.is_initialized() and t.tolist() == [float(world * (world + 1) // 2)] * 4, t
    assert _api._state.fast_path == reader, (_api._state.fast_path, reader)

    # The public function is native but looks like the documented one.
    f = symm.shmem_allreduce
    assert f.__name__ == "shmem_allreduce" and "low_precision_dtype" in (f.__doc__ or ""), f.__doc__
    params = inspect.signature(f).parameters
    assert [(p.name, p.default) for p in params.values()] == [
        ("tensor", inspect.Parameter.empty),
        ("op", "sum"),
        ("group", None),
        ("low_precision_dtype", None),
        ("async_op", False),
    ], params

    # A group is resolved by the full path on first use, then found by the fast path.
    rev = symm.create_group(list(reversed(range(world))))
    takes("full", lambda: symm.shmem_allreduce(torch.zeros(2), group=rev))
    takes("fast", lambda: symm.shmem_allreduce(torch.zeros(2), group=rev))

    # The common case: the fast path, bit-identical to the full path, for every dtype, op
    # spelling, size (one-shot and two-shot), group, argument form, plain and symmetric tensors.
    salt = 0
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8]
    for dtype in dtypes:
        for op in ["sum", "avg", "max", "min", 0, 1, 2, 3, "MAX", True]:
            if op in ("avg", 1) and not dtype.is_floating_point:
                continue
            for count in [1, 7, 1000, 70_000]:
                if count > 1000 and dtype not in (torch.float32, torch.bfloat16):
                    continue
                for group in [None, rev]:
                    salt += 1
                    x = values(rank, count, dtype, salt)
                    want = x.clone()
                    full(symm.shmem_allreduce, want, op, group)  # the full arm
                    f = symm.shmem_allreduce
                    a = symmetric_like(x, group)
                    takes("fast", f, a, op, group)
                    assert same_bits(a, want), (dtype, op, count, group, a, want)
                    symm.free(a)
                    a = x.clone()
                    takes("fast", f, a, op=op, group=group, low_precision_dtype=None)
                    assert same_bits(a, want), (dtype, op, count, group, a, want)
                    a = x.clone()
                    takes("fast", f, tensor=a, group=group, op=op)
                    assert same_bits(a, want), (dtype, op, count, group, a, want)
    # op omitted is "sum"; a Parameter (exact type torch.nn.Parameter) and a view are tensors too
    x = values(rank, 33, torch.float32, 99)
    want = x.clone()
    full(symm.shmem_allreduce, want)
    a = x.clone()
    takes("fast", lambda: symm.shmem_allreduce(a))
    assert same_bits(a, want)
    p = torch.nn.Parameter(x.clone())
    takes("fast", lambda: symm.shmem_allreduce(p))
    assert same_bits(p.detach(), want)
    big = torch.zeros(3, 33)
    big[1] = x
    takes("fast", lambda: symm.shmem_allreduce(big[1]))
    assert same_bits(big[1], want) and not big[0].any() and not big[2].any()

    # async_op=False is the common case; async_op=True (anything but False) takes the full arm,
    # and so does every call while an asynchronous operation may be in flight, until one sees
    # it completed
    a = x.clone()
    takes("fast", lambda: symm.shmem_allreduce(a, async_op=False))
    assert same_bits(a, want)
    a = x.clone()
    w = takes("full", lambda: symm.shmem_allreduce(a, async_op=True))
    assert w.wait() and same_bits(a, want)
    a = x.clone()
    takes("fast", lambda: symm.shmem_allreduce(a))
    assert same_bits(a, want)
    w = takes("full", lambda: symm.shmem_allreduce(x.clone(), async_op=1))
    takes("full", lambda: symm.shmem_allreduce(a))  # ordered after it, which it waits for
    takes("fast", lambda: symm.shmem_allreduce(x.clone()))  # the previous call saw it done
    assert w.is_completed()

    # Names and ops that are not the interned strings (built at run time) are still matched,
    # by their text; so are op codes that are not CPython's cached small ints (a bool).
    x = values(rank, 9, torch.float32, 98)
    want = x.clone()
    full(symm.shmem_allreduce, want, "max")
    a = x.clone()
    kw = {"".join(["ten", "sor"]): a, "".join(["o", "p"]): "".join(["ma", "x"])}
    takes("fast", lambda: symm.shmem_allreduce(**kw))
    assert same_bits(a, want)
    a = x.clone()
    takes("fast", lambda: symm.shmem_allreduce(a, group=None, op=int("2")))
    assert same_bits(a, want)

    # Blocking in the fast path releases the GIL: a thread keeps running while this rank
    # waits for a late peer.
    other_threads_run_while_waiting(rank, lambda: takes("fast", symm.shmem_allreduce, torch.ones(8)), dist.barrier)

    # Not the common case: the full path, with its results and errors.
    x = values(rank, 64, torch.float32, 7)
    ref = x.clone()
    full(symm.shmem_allreduce, ref, "sum", None, torch.bfloat16)
    a = x.clone()
    takes("full", lambda: symm.shmem_allreduce(a, "sum", None, torch.bfloat16))  # a format
    assert same_bits(a, ref)
    a = x.clone()
    takes("full", lambda: symm.shmem_allreduce(a, low_precision_dtype="bfloat16"))
    assert same_bits(a, ref)
    a = x.clone()
    takes("full", lambda: symm.shmem_allreduce(a, torch.tensor(2)))  # op as a tensor: max
    ref = x.clone()
    full(symm.shmem_allreduce, ref, "max")
    assert same_bits(a, ref)

    class MyTensor(torch.Tensor):
        pass

    a = x.clone().as_subclass(MyTensor)
    takes("full", lambda: symm.shmem_allreduce(a))  # a subclass
    ref = x.clone()
    full(symm.shmem_allreduce, ref)
    assert same_bits(a.as_subclass(torch.Tensor), ref)

    # Errors: every rank makes the same mistake; the full arm raises them.
    inv = symm.InvalidArgument
    nc = torch.ones(4, 4).t()
    bad = [
        (inv, (nc,), {}, "contiguous"),
        (inv, (torch.ones(4, dtype=torch.complex64),), {}, "complex64"),
        (inv, (torch.ones(4), "mul"), {}, "op = 'mul'"),
        (inv, (torch.ones(4), 7), {}, "op = 7"),
        (inv, (torch.ones(4), None), {}, "op = None"),
        (inv, (torch.ones(4), 2.0), {}, "op = 2.0"),
        (inv, ([1.0, 2.0],), {}, "expected a torch tensor"),
        (inv, (torch.ones(4).to_sparse(),), {}, "sparse"),
        (inv, (torch.ones(4),), {"low_precision_dtype": "fp33"}, "fp33"),
        (symm.Unsupported, (torch.ones(4, device="meta"),), {}, "meta"),
    ]
    for cls, args, kwargs, needle in bad:
        expect(cls, partial(takes, "full", symm.shmem_allreduce, *args, **kwargs), needle, rank=rank)
    # Arguments that do not bind raise TypeError, as for a Python function, before either path.
    for call in [
        lambda: symm.shmem_allreduce(),
        lambda: symm.shmem_allreduce(torch.ones(1), "sum", None, None, False, 5),
        lambda: symm.shmem_allreduce(torch.ones(1), bogus=1),
        lambda: symm.shmem_allreduce(torch.ones(1), "sum", op="max"),
    ]:
        raises(TypeError, takes, "fast", call)  # "fast": the full path does not run

    # A group this rank is not a member of: GroupError from the full path, also once cached.
    if world > 2:
        g01 = symm.create_group([0, 1])
        for _ in range(2):
            if rank >= 2:
                expect(symm.GroupError, lambda: takes("full", lambda: symm.shmem_allreduce(x, group=g01)), "member")
            else:
                takes("fast" if _ else "full", lambda: symm.shmem_allreduce(torch.ones(2), group=g01))

    # One rank with a bad argument (full path, which rejects the round), the others valid
    # (fast path, waiting in the core): the bad rank raises InvalidArgument, the others
    # PeerRejected at once, and the group stays usable. Then the other way round.
    for bad_rank in [1, 0]:
        t0 = time.monotonic()
        if rank == bad_rank:
            expect(inv, lambda: takes("full", lambda: symm.shmem_allreduce(nc)), "contiguous", rank=rank)
        else:
            expect(
                symm.PeerRejected,
                lambda: takes("fast", lambda: symm.shmem_allreduce(torch.ones(16))),
                f"global rank {bad_rank} rejected",
                rank=rank,
            )
        assert time.monotonic() - t0 < 5, time.monotonic() - t0
        t = torch.full((2,), 1.0)
        takes("fast", symm.shmem_allreduce, t)
        assert t.tolist() == [float(world)] * 2, t
    # A fast-path rank and a full-path rank that disagree (format): Mismatch on both.
    lp = "bfloat16" if rank == 0 else None
    expect(symm.Mismatch, lambda: symm.shmem_allreduce(torch.ones(64), low_precision_dtype=lp), rank=rank)
    # sizes that differ: Mismatch from the core on the fast path
    expect(symm.Mismatch, lambda: takes("fast", lambda: symm.shmem_allreduce(torch.ones(4 + rank))), rank=rank)

    # While the profiler records, calls take the full path, which records the range.
    t = torch.ones(5)
    with torch.profiler.profile() as prof:
        takes("full", lambda: symm.shmem_allreduce(t, "max"))
        takes("full", lambda: symm.shmem_allreduce(t, group=rev))
    keys = {e.key for e in prof.key_averages()}
    assert "symm::allreduce(5 x float32, group=world)" in keys, sorted(k for k in keys if "symm" in k)
    assert f"symm::allreduce(5 x float32, group={list(reversed(range(world)))})" in keys, keys
    takes("fast", lambda: symm.shmem_allreduce(t))  # profiler off again
    assert t.tolist() == [float(world * world)] * 5, t
    # The flag is followed call by call (the fast path keeps its last `False` reading only while
    # the module's dict is unchanged): set and cleared as torch's profilers do, with fast calls
    # in between.
    for _ in range(2):
        takes("fast", lambda: symm.shmem_allreduce(t))
        takes("fast", lambda: symm.shmem_allreduce(t))
        torch.autograd.profiler._set_is_profiler_enabled(True)
        try:
            takes("full", lambda: symm.shmem_allreduce(t))
        finally:
            torch.autograd.profiler._set_is_profiler_enabled(False)
    takes("fast", lambda: symm.shmem_allreduce(t))
    assert t.tolist() == [float(world**9)] * 5, t

    if reader == "handle":
        readers_found()

    # symm.stats counts the fast path's calls like any other (the core counts them).
    symm.reset_stats()
    for _ in range(3):
        symm.shmem_allreduce(torch.ones(8))
    st = {s["op"]: s for s in symm.stats()}
    assert st["allreduce"]["calls"] == 3 and st["allreduce"]["bytes"] == 3 * 32, st
    dist.barrier()


def readers_found():
    """How the fast path would read tensors for other platform values (the probing of
    ``Communicator.enable_fast_path``; a later call changes nothing, it only answers)."""
    platform = _api._state.platform
    fast = platform.fast_path()
    comm = _api._state.comm

    def reader(types=fast.tensor_types, shim=fast.shim, probes=fast.probes):
        return comm.enable_fast_path(types, fast.dtypes, fast.profiler, None, shim, list(probes))

    assert reader() == "handle"
    # The at::Tensor is looked for only where the platform says the objects hold it.
    assert reader(shim={k: v for k, v in fast.shim.items() if k != "tensor_in_object"}) == "shim"
    assert reader(shim={**fast.shim, "tensor_in_object": False}) == "shim"
    # Its offset needs at least two probes with distinct tensors of the types read.
    assert reader(probes=[torch.ones(3)]) == "shim"
    assert reader(probes=[torch.ones(3), torch.ones(2)]) == "handle"
    base = torch.ones(4)
    assert reader(probes=[base, base.view(2, 2)]) == "handle"  # two views, two TensorImpls
    assert reader(probes=[torch.ones(2).to_sparse()]) == "shim"  # of a type read, but sparse...
    # ...and probes of other types only, or none at all
    assert reader(probes=["not a tensor", 3]) == "shim"
    assert reader(probes=[]) == "descriptors"

    # A type read whose `_cdata` is its own: no offset (it may not hold the tensor there).
    class OwnCdata(torch.Tensor):
        @property
        def _cdata(self):
            return 0

    assert reader(types=(torch.Tensor, OwnCdata)) == "shim"
    assert reader(types=(torch.Tensor, torch.nn.Parameter)) == "handle"
    # The fast path in use is still the one symm.init enabled.
    assert _api._state.fast_path == "handle"


def full_path_only(rank, world):
    """SYMM_FAST_PATH=0: the fast path is off; every call takes the full path and works."""
    symm.init()
    assert _api._state.fast_path is None
    t = torch.full((3,), float(rank))
    takes("full", symm.shmem_allreduce, t)
    takes("full", symm.shmem_allreduce, t, "max")
    assert t.tolist() == [float(sum(range(world)))] * 3, t
    dist.barrier()


def fast_path_split_ops(rank, world):
    """shmem_reduce_scatter, shmem_allgather, shmem_broadcast, shmem_send and shmem_recv: the
    common case takes the fast path with the full path's results bit for bit; every other call
    the full path, with its errors and rejections; the profiler still sees every call."""
    symm.init()
    assert _api._state.fast_path is not None
    rs, ag, bc = symm.shmem_reduce_scatter, symm.shmem_allgather, symm.shmem_broadcast
    for f, kind, params in [
        (rs, "reduce_scatter", ["output_tensor", "input_tensor", "op", "group", "low_precision_dtype", "async_op"]),
        (ag, "allgather", ["output_tensor", "input_tensor", "group", "async_op"]),
        (symm.shmem_alltoall, "alltoall", ["send_tensor_list", "receive_tensor", "receive_list", "group", "async_op"]),
        (bc, "broadcast", ["tensor", "src_rank", "group", "async_op"]),
        (symm.shmem_send, "send", ["tensor", "dst_rank", "group", "async_op"]),
        (symm.shmem_recv, "recv", ["tensor", "src_rank", "group", "async_op"]),
        (
            symm.shmem_sendrecv,
            "sendrecv",
            ["send_tensor", "dst_rank", "recv_tensor", "src_rank", "group", "async_op"],
        ),
    ]:
        assert f is getattr(_symm, f.__name__) and f is getattr(_api, f.__name__), f
        assert [p.name for p in inspect.signature(f).parameters.values()] == params, (kind, inspect.signature(f))
        assert "``group``" in (f.__doc__ or ""), f.__doc__
    rev = symm.create_group(list(reversed(range(world))))
    for kind, call in [
        ("reduce_scatter", lambda: rs(torch.zeros(1), torch.zeros(world), group=rev)),
        ("allgather", lambda: ag(torch.zeros(world), torch.zeros(1), group=rev)),
        ("broadcast", lambda: bc(torch.zeros(1), 0, group=rev)),
    ]:
        takes("full" if kind == "reduce_scatter" else "fast", call)  # the group: cached once

    salt = 0
    for dtype in [torch.float32, torch.bfloat16, torch.int64, torch.uint8]:
        for count in [1, 7, 1000]:
            for group in [None, rev]:
                n = world
                me = rank if group is None else world - 1 - rank
                salt += 1
                # reduce_scatter, out of place and in place (output = this rank's part)
                for op in ["sum", "max", 3]:
                    x = values(rank, n * count, dtype, salt)
                    want = torch.empty(count, dtype=dtype)
                    full(symm.shmem_reduce_scatter, want, x.clone(), op, group)
                    out = torch.empty(count, dtype=dtype)
                    takes("fast", rs, out, x.clone(), op, group)
                    assert same_bits(out, want), ("reduce_scatter", dtype, count, group, op)
                    a = symmetric_like(x, group)
                    takes("fast", rs, a[me * count : (me + 1) * count], a, op=op, group=group)
                    assert same_bits(a[me * count : (me + 1) * count], want), ("reduce_scatter in place", dtype)
                    symm.free(a)
                # allgather, out of place and in place (input = this rank's part of the output)
                x = values(rank, count, dtype, salt)
                want = torch.empty(n * count, dtype=dtype)
                full(symm.shmem_allgather, want, x, group)
                out = torch.empty(n * count, dtype=dtype)
                takes("fast", ag, out, x, group)
                assert same_bits(out, want), ("allgather", dtype, count, group)
                out = torch.zeros(n * count, dtype=dtype)
                out[me * count : (me + 1) * count] = x
                takes(
                    "fast",
                    ag,
                    output_tensor=out,
                    input_tensor=out[me * count : (me + 1) * count],
                    group=group,
                )
                assert same_bits(out, want), ("allgather in place", dtype, count, group)
                # broadcast from every group rank
                for src in range(n):
                    x = values(rank, count, dtype, salt + src)
                    want = x.clone()
                    full(symm.shmem_broadcast, want, src, group)
                    a = x.clone()
                    takes("fast", bc, a, src, group)
                    assert same_bits(a, want), ("broadcast", dtype, count, group, src)

    # alltoall with uneven counts (what rank s sends to rank d: s + 2 d + 1 elements), lists and
    # tuples, plain and symmetric send tensors, world and reversed group
    a2a = symm.shmem_alltoall
    for group in [None, rev]:
        me = rank if group is None else world - 1 - rank
        for scale in [1, 300]:
            sends = [values(rank, scale * (me + 2 * d + 1), torch.float32, 50 + d) for d in range(world)]
            counts = [scale * (s + 2 * me + 1) for s in range(world)]
            want = torch.full((sum(counts) + 3,), -1.0)
            full(symm.shmem_alltoall, sends, want, counts, group)
            for form in [list, tuple]:
                got = torch.full((sum(counts) + 3,), -1.0)
                takes("fast", a2a, form(sends), got, form(counts), group)
                assert same_bits(got, want), ("alltoall", group, scale, form)
            # views into one symmetric block (the same size on every rank)
            block = symm.empty((3 * scale * world * world,), torch.float32, group=group)
            sym, at = [], 0
            for t in sends:
                sym.append(block[at : at + t.numel()])
                sym[-1].copy_(t)
                at += t.numel()
            got = torch.full((sum(counts) + 3,), -1.0)
            takes(
                "fast", a2a, send_tensor_list=sym, receive_tensor=got, receive_list=counts, group=group
            )
            assert same_bits(got, want), ("alltoall symmetric", group, scale)
            symm.free(block)
            # counts as one integer tensor (HyperParallel's form: int64), 1-D or (n, 1), or as
            # one-element tensors: the fast path, same result
            ct = torch.tensor(counts)
            forms = [ct, ct.to(torch.int32), ct.to(torch.int16), ct.view(-1, 1), list(ct), tuple(ct.view(-1, 1))]
            for c in forms:
                got = torch.full((sum(counts) + 3,), -1.0)
                takes("fast", a2a, sends, got, c, group)
                assert same_bits(got, want), ("alltoall counts tensor", group, scale, c)
            # a strided view of counts: the full path, same result
            got = torch.full((sum(counts) + 3,), -1.0)
            takes("full", a2a, sends, got, torch.stack([ct, ct], 1)[:, 0], group)
            assert same_bits(got, want), ("alltoall strided counts", group, scale)

    # send / recv around a ring, in both directions, world and reversed group; even ranks send
    # first (eager messages would not need it; this keeps the pattern valid for any size). Then
    # sendrecv around the same ring, by position and by keyword: both directions at once, no
    # ordering.
    send, recv, sendrecv = symm.shmem_send, symm.shmem_recv, symm.shmem_sendrecv
    for group in [None, rev]:
        me = rank if group is None else world - 1 - rank
        for count in [1, 1000, 70_000]:
            for step in [1, world - 1]:
                nxt, prv = (me + step) % world, (me - step) % world
                x = values(rank, count, torch.float32, count + step)
                peer = prv if group is None else world - 1 - prv
                want = values(peer, count, torch.float32, count + step)
                got = torch.empty(count)
                sending = partial(takes, "fast", send, x, nxt, group)
                receiving = partial(takes, "fast", recv, got, prv, group)
                for call in (sending, receiving) if me % 2 == 0 else (receiving, sending):
                    call()
                assert same_bits(got, want), ("send/recv", group, count, step)
                got = torch.empty(count)
                takes("fast", sendrecv, x, nxt, got, prv, group)
                assert same_bits(got, want), ("sendrecv", group, count, step)
                got = torch.empty(count)
                kw = dict(send_tensor=x, dst_rank=nxt, recv_tensor=got, src_rank=prv, group=group)
                takes("fast", sendrecv, **kw)
                assert same_bits(got, want), ("sendrecv by keyword", group, count, step)
    # Overlapping tensors: the core refuses them on either arm, naming them.
    both = torch.zeros(8)
    for call in [partial(takes, "fast", sendrecv), partial(full, sendrecv)]:
        e = expect(symm.InvalidArgument, partial(call, both[:5], rank, both[4:], rank), "overlap", rank=rank)
        assert "recv_tensor" in str(e) and "send_tensor" in str(e), e
    # A message that does not match the receive: Mismatch (consumed; the pair stays usable).
    if rank == 0:
        takes("fast", send, torch.ones(3), 1)
        takes("fast", send, torch.full((2,), 7.0), 1)
    elif rank == 1:
        expect(symm.Mismatch, lambda: takes("fast", recv, torch.empty(4), 0), rank=rank)
        got = torch.empty(2)
        takes("fast", recv, got, 0)
        assert got.tolist() == [7.0, 7.0], got
    # Ranks the fast path does not take: the full path, with its errors.
    for f in (send, recv):
        for peer in [world, -1, "1"]:
            raises((symm.InvalidArgument, symm.GroupError), takes, "full", f, torch.ones(1), peer)
    dist.barrier()

    # Not the common case: the full path, with the same results.
    x = values(rank, world * 64, torch.float32, 5)
    want = torch.empty(64)
    full(symm.shmem_reduce_scatter, want, x.clone(), "sum", None, torch.bfloat16)
    out = torch.empty(64)
    takes("full", rs, out, x.clone(), low_precision_dtype="bfloat16")  # a format
    assert same_bits(out, want)
    a = torch.full((3,), float(rank))
    takes("full", bc, a, torch.tensor(1))  # src_rank as a tensor
    assert a.tolist() == [1.0] * 3, a
    a = torch.full((3,), float(rank))
    takes("full", bc, a, True)  # a bool is not taken for a rank
    assert a.tolist() == [1.0] * 3, a

    # Errors: every rank makes the same mistake; the full path raises them, with the same class
    # and message as a direct call of the full path.
    inv = symm.InvalidArgument
    bad = [
        ("reduce_scatter", rs, (torch.ones(2), torch.ones(world * 2 + 1)), "input_tensor"),
        ("reduce_scatter", rs, (torch.ones(2), torch.ones(world * 2, dtype=torch.float64)), "dtype"),
        ("reduce_scatter", rs, (torch.ones(2), torch.ones(world * 2), "mul"), "op = 'mul'"),
        ("allgather", ag, (torch.ones(world * 2 + 1), torch.ones(2)), "output_tensor"),
        ("allgather", ag, (torch.ones(world * 2), torch.ones(2, dtype=torch.int32)), "dtype"),
        ("allgather", ag, (torch.ones(world * 2), torch.ones(4, 4).t()[0]), "contiguous"),
        ("alltoall", a2a, ([torch.ones(1)] * (world - 1), torch.ones(world), [1] * world), "send_tensor_list"),
        ("alltoall", a2a, ([torch.ones(1)] * world, torch.ones(world), [1] * (world + 1)), "receive_list"),
        ("alltoall", a2a, ([torch.ones(1)] * world, torch.ones(world - 1), [1] * world), "receive_list"),
        ("alltoall", a2a, ([torch.ones(1, dtype=torch.int32)] * world, torch.ones(world), [1] * world), "dtype"),
        ("alltoall", a2a, ([torch.ones(1)] * world, torch.ones(world), [1] * (world - 1) + [-1]), "receive_list"),
        # counts as tensors: a negative one, a first dimension that is not the group size, floats
        ("alltoall", a2a, ([torch.ones(1)] * world, torch.ones(world), torch.tensor([1] * (world - 1) + [-1])), "-1"),
        (
            "alltoall",
            a2a,
            ([torch.ones(1)] * world, torch.ones(world), torch.ones(1, world, dtype=torch.int64)),
            "receive_list",
        ),
        ("alltoall", a2a, ([torch.ones(1)] * world, torch.ones(world), torch.ones(world)), "receive_list"),
        ("broadcast", bc, (torch.ones(2), world), "src_rank"),
        ("broadcast", bc, (torch.ones(2), -1), "src_rank"),
        ("broadcast", bc, (torch.ones(2), "0"), "src_rank"),
    ]
    for kind, f, args, needle in bad:
        try:
            full(f, *args)
        except symm.SymmError as e:
            direct = e
        else:
            raise AssertionError(f"{kind}{args}: expected an error")
        assert isinstance(direct, (inv, symm.GroupError)), direct  # a rank outside the group
        # The same error whichever arm the call takes (the core checks sizes, dtypes and counts
        # for both).
        e = expect(type(direct), partial(f, *args), needle, rank=rank)
        assert str(e) == str(direct), (str(e), str(direct))
    for call in [lambda: rs(torch.ones(1)), lambda: ag(torch.ones(1), bogus=1), lambda: bc(torch.ones(1))]:
        raises(TypeError, call)

    # One rank with a bad source rank (full path, which rejects the call), the others valid
    # (fast path): a small broadcast's source does not wait, so the valid ranks complete it
    # among themselves at once, and the group stays usable.
    t0 = time.monotonic()
    if rank == 1:
        expect(
            symm.GroupError, lambda: takes("full", bc, torch.ones(4), world), "src_rank", rank=rank
        )
    elif ON_REFERENCE:
        # The reference collectives' broadcast is a round: every member learns of the rejection.
        got = torch.full((4,), float(rank))
        expect(symm.PeerRejected, lambda: takes("fast", bc, got, 0), "global rank 1 rejected", rank=rank)
    else:
        got = torch.full((4,), float(rank))
        takes("fast", bc, got, 0)
        assert got.tolist() == [0.0] * 4, got
    assert time.monotonic() - t0 < 5, time.monotonic() - t0
    a = torch.full((2,), float(rank))
    takes("fast", bc, a, world - 1)
    assert a.tolist() == [float(world - 1)] * 2, a
    # sizes that differ: Mismatch from the core on the fast path
    expect(
        symm.Mismatch,
        lambda: takes("fast", ag, torch.ones(world * (2 + rank)), torch.ones(2 + rank)),
        rank=rank,
    )

    # Blocking on the fast path releases the GIL: a thread keeps running while this rank waits
    # (a member of the broadcast: its source does not wait for the others).
    other_threads_run_while_waiting(
        rank, lambda: takes("fast", bc, torch.ones(8), world - 1), dist.barrier
    )

    # While the profiler records, calls take the full path, which records the range.
    with torch.profiler.profile() as prof:
        takes("full", rs, torch.ones(3), torch.ones(3 * world))
        takes("full", ag, torch.ones(3 * world), torch.ones(3))
        takes("full", bc, torch.ones(3), 0)
        takes("full", a2a, [torch.ones(1)] * world, torch.ones(world), [1] * world)
        if rank < 2:
            takes("full", send, torch.ones(3), 1 - rank)
            takes("full", recv, torch.ones(3), 1 - rank)
    keys = {e.key for e in prof.key_averages()}
    for name in ["reduce_scatter", "allgather", "broadcast", "alltoall"] + (["send", "recv"] if rank < 2 else []):
        assert any(k.startswith(f"symm::{name}(") for k in keys), (name, sorted(k for k in keys if "symm" in k))
    dist.barrier()
