"""Tensors without real storage, or whose Python side misreports it, at every entry point (run
by worker.py as ``scenarios_tensors.<name>``).

A FakeTensor (what ``torch.compile`` traces with: CPU, contiguous, data pointer 0), a wrapper
subclass (``_make_wrapper_subclass``, DTensor-style), a plain tensor whose storage was freed
with ``untyped_storage().resize_(0)`` (as FSDP frees parameters), a view whose storage shrank
under it, and a subclass whose C++ ``numel`` (custom sizes policy) claims more than its storage
holds: each is refused with InvalidArgument naming the argument, on the fast path and the full
path, and a collective's peers get PeerRejected at once (the rejection round); the group, the
pair or the heap stays usable. Subclasses whose Python ``numel()``/``data_ptr()`` (or
``__torch_function__``) misreport are read for what their C++ tensor holds.
"""

from __future__ import annotations

import os
import time
from functools import partial

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensorMode

import symm
from scenarios import expect
from scenarios_fast import read_tensors_as, takes
from symm import _api

#: How long a peer may take to learn of a refusal (the wait bound is SYMMETRIC_MEMORY_TIMEOUT,
#: 20 s in the harness): a rejection arrives within a fraction of a second.
PROMPT = 5.0

NO_MEMORY = "has no memory behind it"
OUTSIDE = "reaches outside its storage"


def fake(n, dtype=torch.float32):
    with FakeTensorMode():
        return torch.ones(n, dtype=dtype)


class Wrapper(torch.Tensor):
    """A wrapper subclass (as DTensor is): no storage of its own, the data in ``inner``."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=inner.device)

    def __init__(self, inner):
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        unwrap = lambda x: x.inner if isinstance(x, Wrapper) else x  # noqa: E731
        return func(*pytree.tree_map(unwrap, args), **pytree.tree_map(unwrap, kwargs or {}))


def wrapper(n, dtype=torch.float32):
    return Wrapper(torch.ones(n, dtype=dtype))


def freed(n, dtype=torch.float32):
    t = torch.ones(n, dtype=dtype)
    t.untyped_storage().resize_(0)
    return t


def freed_parameter(n, dtype=torch.float32):
    """A parameter freed the way FSDP frees it (its storage resized to 0 bytes)."""
    p = torch.nn.Parameter(torch.ones(n, dtype=dtype), requires_grad=False)
    p.untyped_storage().resize_(0)
    return p


def past(n, dtype=torch.float32):
    """A contiguous view at storage offset ``n`` whose storage shrank to ``n`` elements."""
    base = torch.ones(2 * n, dtype=dtype)
    view = base[n:]
    base.untyped_storage().resize_(n * base.element_size())
    return view


class BigSizes(torch.Tensor):
    """Real storage of 1 element; its C++ sizes (custom sizes policy) claim ``claim`` (more)."""

    claim = 1

    @staticmethod
    def __new__(cls, data):
        return torch.Tensor._make_subclass(cls, data, False, dispatch_sizes_strides_policy="sizes")

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        o = torch.ops.aten
        if func in (o.sym_numel.default, o.numel.default):
            return cls.claim
        if func is o.sym_size.default:
            return [cls.claim]
        if func is o.sym_stride.default:
            return [1]
        if func is o.sym_storage_offset.default:
            return 0
        if func in (o.is_contiguous.default, o.is_contiguous.memory_format):
            return True
        raise NotImplementedError(func)


def big_sizes(n, dtype=torch.float32):
    cls = type("BigSizes", (BigSizes,), {"claim": n + 1})
    return cls(torch.ones(1, dtype=dtype))


#: Each bad kind and what its refusal says.
BAD = {"fake": (fake, NO_MEMORY), "wrapper": (wrapper, NO_MEMORY), "freed": (freed, NO_MEMORY)}
BAD["freed_parameter"] = (freed_parameter, NO_MEMORY)
BAD.update({"past": (past, OUTSIDE), "big_sizes": (big_sizes, OUTSIDE)})


def set_reader():
    """SYMM_TEST_FAST_READER (handle, shim, descriptors): how the fast path must read tensors
    (as in scenarios_fast.fast_path); set before symm.init."""
    reader = os.environ.get("SYMM_TEST_FAST_READER", "handle")
    read_tensors_as(reader)
    symm.init()
    assert _api._state.fast_path == reader, (_api._state.fast_path, reader)
    return reader


def usable(world):
    """The world group still works, with the right sum."""
    t = torch.ones(3)
    symm.shmem_allreduce(t)
    assert t.tolist() == [float(world)] * 3, t


def collectives(n):
    """``(kind, arg, call)``: ``call(x)`` runs the collective with ``x(arg_name, count)`` for
    each tensor (entry 0 of a send list named as the list); the bad rank is the last."""
    ar, rs, ag, a2a, bc = (
        symm.shmem_allreduce,
        symm.shmem_reduce_scatter,
        symm.shmem_allgather,
        symm.shmem_alltoall,
        symm.shmem_broadcast,
    )

    def alltoall(x, counts):
        sends = [x("send_tensor_list", counts[0])] + [torch.ones(c) for c in counts[1:]]
        return a2a(sends, x("receive_tensor", sum(counts)), counts)

    out = [
        ("allreduce", "tensor", lambda x: ar(x("tensor", 8))),
        ("allreduce (a format)", "tensor", lambda x: ar(x("tensor", 8), low_precision_dtype="bfloat16")),
        # From the bad rank: a root's peers wait for its data (an eager root does not wait for
        # its peers, so it cannot learn of their refusal).
        ("broadcast", "tensor", lambda x: bc(x("tensor", 8), n - 1)),
    ]
    for arg in ("output_tensor", "input_tensor"):
        out.append(("reduce_scatter", arg, lambda x: rs(x("output_tensor", 4), x("input_tensor", 4 * n))))
        out.append(("allgather", arg, lambda x: ag(x("output_tensor", 4 * n), x("input_tensor", 4))))
    for arg in ("send_tensor_list", "receive_tensor"):
        out.append(("alltoall", arg, lambda x: alltoall(x, [2] * n)))
        out.append(("alltoallv", arg, lambda x: alltoall(x, [3] * n)))
    return out


def refused_everywhere(rank, world):
    """Every collective, every bad kind, every tensor argument: the bad rank gets
    InvalidArgument naming the argument (and the fast path declines a plain tensor before doing
    anything), its peers PeerRejected at once, and the group stays usable."""
    reader = set_reader()
    bad_rank = world - 1
    fake(1)  # FakeTensorMode's first use takes seconds: not in the timed calls
    for kind, (make, says) in BAD.items():
        for op, arg, call in collectives(world):

            def x(name, count, _arg=arg, _make=make):
                if rank == bad_rank and name == _arg:
                    return _make(count)
                return torch.ones(count)

            t0 = time.monotonic()
            if rank == bad_rank:
                # The fast arm hands the call to the full arm before doing anything.
                e = expect(symm.InvalidArgument, partial(takes, "full", call, x), f"{arg} = ", says, rank=rank)
                assert "entry 0" in str(e) or arg != "send_tensor_list", str(e)
            else:
                try:
                    expect(symm.PeerRejected, partial(call, x), f"global rank {bad_rank} rejected")
                except AssertionError as e:
                    raise AssertionError(f"{kind} {op} {arg}: {e}") from e
            assert time.monotonic() - t0 < PROMPT, (kind, op, arg, time.monotonic() - t0)
            usable(world)
    # Counts given as a tensor without data, an op given as one: refused as values. (Iterating
    # over a wrapper gives its inner tensor's elements, which are counts like any others.)
    for kind, (make, _) in BAD.items():
        t0 = time.monotonic()
        counts = make(world, torch.int64) if rank == bad_rank and kind != "wrapper" else [2] * world
        call = partial(symm.shmem_alltoall, [torch.ones(2)] * world, torch.zeros(2 * world), counts)
        if rank == bad_rank and kind != "wrapper":
            expect(symm.InvalidArgument, call, "receive_list = ", rank=rank)
        elif kind != "wrapper":
            expect(symm.PeerRejected, call, f"global rank {bad_rank} rejected")
        assert time.monotonic() - t0 < PROMPT, (kind, time.monotonic() - t0)
        t0 = time.monotonic()
        op = make(1, torch.int64) if rank == bad_rank else "sum"
        if rank == bad_rank:
            expect(symm.InvalidArgument, partial(symm.shmem_allreduce, torch.ones(2), op), "op = ", rank=rank)
        else:
            expect(symm.PeerRejected, partial(symm.shmem_allreduce, torch.ones(2), op), "rejected")
        assert time.monotonic() - t0 < PROMPT, (kind, time.monotonic() - t0)
        usable(world)
    # Every rank bad at once: every rank refuses its own, nobody waits.
    for make, says in BAD.values():
        t0 = time.monotonic()
        expect(symm.InvalidArgument, partial(symm.shmem_allreduce, make(8)), "tensor = ", says, rank=rank)
        assert time.monotonic() - t0 < PROMPT
    # Strides reaching outside a shrunk storage: such a view is not contiguous, and refused as
    # such before its memory is considered; a contiguous one with a size-1 dimension whose
    # stride is huge only spans its elements, and works.
    base = torch.ones(16)
    strided = base[::4]
    base.untyped_storage().resize_(8)
    expect(symm.InvalidArgument, partial(symm.shmem_allreduce, strided), "tensor = ", "contiguous", rank=rank)
    wide = torch.ones(8).as_strided((1, 4), (1000, 1), 2)
    assert wide.is_contiguous()
    symm.shmem_allreduce(wide)
    assert wide.tolist() == [[float(world)] * 4], wide
    # Inside FakeTensorMode (as torch.compile traces): refused, as outside.
    with FakeTensorMode():
        t = torch.ones(8)
        expect(symm.InvalidArgument, partial(symm.shmem_allreduce, t), "tensor = ", NO_MEMORY, rank=rank)
    usable(world)
    dist.barrier()
    print(f"rank {rank}: reader {reader}: every refusal held", flush=True)


def point_to_point(rank, world):
    """send/recv/sendrecv: a bad tensor is refused before any message moves (nothing is sent,
    nothing consumed), so the pair stays in step: the next, good message arrives at once."""
    set_reader()
    fake(1)  # FakeTensorMode's first use takes seconds: not in the timed calls
    assert world == 2
    peer = 1 - rank
    # The fast arm hands each refused call to the full arm before doing anything.
    on_full = partial(takes, "full")
    for kind, (make, says) in BAD.items():
        data = torch.arange(8, dtype=torch.float32) + 10 * rank
        # A refused send: the receiver gets the next (good) message, promptly.
        t0 = time.monotonic()
        if rank == 0:
            expect(symm.InvalidArgument, partial(on_full, symm.shmem_send, make(8), 1), "tensor = ", says)
            symm.shmem_send(data, 1)
        else:
            got = torch.zeros(8)
            symm.shmem_recv(got, 0)
            assert got.tolist() == list(range(8)), got
        # A refused recv consumes nothing: the message is still there for the next recv.
        if rank == 1:
            expect(symm.InvalidArgument, partial(on_full, symm.shmem_recv, make(8), 0), "tensor = ", says)
            got = torch.zeros(8)
            symm.shmem_recv(got, 0)
            assert got.tolist() == list(range(8)), got
        else:
            symm.shmem_send(data, 1)
        # sendrecv, either tensor bad on rank 0; then a good exchange pairs with the peer's.
        for arg in ("send_tensor", "recv_tensor"):
            got = torch.zeros(8)
            if rank == 0:
                s, r = (make(8), got) if arg == "send_tensor" else (data, make(8))
                call = partial(on_full, symm.shmem_sendrecv, s, 1, r, 1)
                expect(symm.InvalidArgument, call, f"{arg} = ", says, rank=rank)
            symm.shmem_sendrecv(data, peer, got, peer)
            assert got.tolist() == (torch.arange(8, dtype=torch.float32) + 10 * peer).tolist(), got
        assert time.monotonic() - t0 < PROMPT, (kind, time.monotonic() - t0)
    dist.barrier()


def one_sided(rank, world):
    """put/get/put_with_signal/signal_op/wait_for_signal: a bad local (``src``) or symmetric
    (``target``, ``signal``) tensor is refused on the caller before anything moves; the peer's
    heap is untouched and one-sided calls go on working."""
    symm.init()
    n = 8
    s = symm.empty(n, torch.float32)
    s.fill_(-1.0)
    sig = symm.empty(1, torch.int64)
    sig.zero_()
    dist.barrier()
    peer = (rank + 1) % world
    good = torch.full((n,), float(rank))
    put, get, pws = symm.shmem_put, symm.shmem_get, symm.shmem_put_with_signal
    for make, says in BAD.values():
        b, bi = make(n), make(1, torch.int64)
        calls = [
            ("src", partial(put, s, 0, b, 0, n, peer)),
            ("src", partial(get, s, 0, b, 0, n, peer)),
            ("src", partial(pws, s, 0, b, 0, n, sig, 0, 1, 0, peer)),
            ("target", partial(put, b, 0, good, 0, n, peer)),
            ("target", partial(get, b, 0, good.clone(), 0, n, peer)),
            ("target", partial(pws, b, 0, good, 0, n, sig, 0, 1, 0, peer)),
            ("signal", partial(pws, s, 0, good, 0, n, bi, 0, 1, 0, peer)),
            ("signal", partial(symm.shmem_signal_op, bi, 0, 1, 0, peer)),
            ("signal", partial(symm.shmem_wait_for_signal, None, bi, 0, 0, timeout=1)),
        ]
        for arg, call in calls:
            expect(symm.InvalidArgument, call, f"{arg} = ", says, rank=rank)
        # Sizes, offsets, ranks and values given as tensors without data are refused as values,
        # naming the argument (torch itself would read past the storage of some).
        bad = make(1, torch.int64)
        for arg, call in [
            ("size", partial(put, s, 0, good, 0, bad, peer)),
            ("target_offset", partial(put, s, bad, good, 0, n, peer)),
            ("target_rank", partial(get, s, 0, good.clone(), 0, n, bad)),
            ("signal_value", partial(symm.shmem_signal_op, sig, 0, bad, 0, peer)),
        ]:
            expect(symm.InvalidArgument, call, f"{arg} = ", rank=rank)
    dist.barrier()
    assert s.tolist() == [-1.0] * n and sig.item() == 0, (s, sig)  # nothing arrived
    dist.barrier()
    symm.shmem_put_with_signal(s, 0, good, 0, n, sig, 0, 1, 0, peer)
    symm.shmem_wait_for_signal(None, sig, 0, 1)
    assert s.tolist() == [float((rank - 1) % world)] * n, s
    dist.barrier()
    symm.free(sig)
    symm.free(s)


class NumelLies(torch.Tensor):
    def numel(self):
        return 1 << 40

    def data_ptr(self):
        return 8


class TorchFunctionLies(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in ("numel", "data_ptr", "storage_offset"):
            return 1 << 40
        if name == "untyped_storage":
            return torch.UntypedStorage(1 << 20)
        return super().__torch_function__(func, types, args, kwargs or {})


def misreporting_subclasses(rank, world):
    """Subclasses whose Python methods (overrides, ``__torch_function__``) misreport numel,
    data_ptr or storage: symm reads the C++ tensor they are, so the call moves exactly their real
    elements; memory past them (the rest of the base tensor) is untouched."""
    set_reader()
    for cls in (NumelLies, TorchFunctionLies):
        base = torch.full((8,), 5.0)
        t = base[:3].as_subclass(cls)
        symm.shmem_allreduce(t)
        assert base[:3].tolist() == [5.0 * world] * 3 and base[3:].tolist() == [5.0] * 5, (cls, base)
        base = torch.full((8,), float(rank))
        t = base[2:5].as_subclass(cls)
        symm.shmem_broadcast(t, 0)
        assert base[2:5].tolist() == [0.0] * 3 and base[[0, 1, 5, 6, 7]].tolist() == [float(rank)] * 5, base
        # As the source of a put: exactly its 3 elements are read.
        s = symm.empty(4, torch.float32)
        s.fill_(-1.0)
        dist.barrier()
        src = torch.full((8,), 7.0)[:3].as_subclass(cls)
        symm.shmem_put(s, 0, src, 0, 3, (rank + 1) % world)
        expect(symm.InvalidArgument, partial(symm.shmem_put, s, 0, src, 0, 4, 0), "src_offset/size")
        dist.barrier()
        assert s.tolist() == [7.0, 7.0, 7.0, -1.0], s
        symm.free(s)
    dist.barrier()
