"""torch.distributed's backend "symm" (symm/c10d.py) next to Gloo on real ranks (run by worker.py
as ``scenarios_c10d.<name>``).

Every operation runs twice with the same inputs, once on a "symm" group and once on a Gloo group
of the same ranks, and the results are compared: bit for bit where the two reduce in the same
order (two members: ``a + b`` either way; integers, MAX and MIN anywhere), within float32
rounding otherwise (symm reduces in group-rank order, Gloo in its ring's order). Where Gloo has
no such operation (PREMUL_SUM, dtypes it does not move) the reference is computed here.
"""

from __future__ import annotations

import datetime
import os
import time
import warnings
from typing import Any, Callable, List, Optional

import torch
import torch.distributed as dist

RED = dist.ReduceOp
FLOATS = [torch.float32, torch.bfloat16, torch.float16]
INTS = [torch.int32, torch.int64]
ALL_OPS = [RED.SUM, RED.AVG, RED.MAX, RED.MIN, RED.PRODUCT, RED.BAND, RED.BOR, RED.BXOR]
BITWISE = (RED.BAND, RED.BOR, RED.BXOR)


def data(seed: int, shape: Any, dtype: torch.dtype, rank: int) -> torch.Tensor:
    """Rank ``rank``'s input number ``seed``: floats in [0.5, 1.5) (products of four stay in
    range), small integers, bools; any rank can build any other rank's."""
    g = torch.Generator().manual_seed(7919 * seed + rank)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.complex(torch.rand(shape, generator=g), torch.rand(shape, generator=g)).to(dtype)
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=g) + 0.5).to(dtype)
    low = 0 if dtype in (torch.uint8, torch.uint16) else -20
    return torch.randint(low, 20, shape, generator=g).to(dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


class Pair:
    """A "symm" group and a Gloo group of the same members, in the same order."""

    def __init__(self, symm_group: Any, gloo_group: Any, members: List[int], rank: int) -> None:
        self.s, self.g = symm_group, gloo_group
        self.members = members
        self.n = len(members)
        self.me = members.index(rank)
        self.global_rank = rank
        # Two members reduce in the same order in both libraries (a + b is b + a).
        self.exact = self.n <= 2
        self.checked = 0

    def same(self, what: str, a: Any, b: Any, exact: Optional[bool] = None) -> None:
        """``a`` (symm's) equals ``b`` (the reference): bit for bit when ``exact``, else within
        the rounding of a different summation order."""
        if isinstance(a, (list, tuple)):
            assert len(a) == len(b), (what, len(a), len(b))
            for i, (x, y) in enumerate(zip(a, b)):
                self.same(f"{what}[{i}]", x, y, exact)
            return
        exact = self.exact if exact is None else exact
        if a.dtype == torch.bool:
            # Gloo's bool SUM leaves the byte sum in the tensor (a "True" of value 2); symm's
            # bools are 0 or 1. Compared by truth value.
            byte = a.contiguous().view(torch.uint8)
            ok = b.dtype == torch.bool and torch.equal(byte != 0, b.contiguous().view(torch.uint8) != 0)
            ok = ok and bool((byte <= 1).all())
        elif exact or not (a.is_floating_point() or a.is_complex()):
            ok = same_bits(a.contiguous(), b.contiguous())
        else:
            tol = 1e-5 if a.dtype in (torch.float32, torch.float64) else 2e-2
            ok = a.dtype == b.dtype and torch.allclose(a.double(), b.double(), rtol=tol, atol=tol)
        assert ok, f"rank {self.global_rank}, {what}: symm {a.flatten()[:6]} vs reference {b.flatten()[:6]}"
        self.checked += 1

    def both(self, what: str, fn: Callable[[Any], Any], exact: Optional[bool] = None) -> None:
        """Runs ``fn(group)`` on the symm group and on the Gloo group and compares the results."""
        self.same(what, fn(self.s), fn(self.g), exact)

    def peer(self, i: int) -> int:
        """The global rank of group rank ``i`` (torch's functions take global ranks)."""
        return self.members[i]


def exact_for(op: Any, dtype: torch.dtype, pair: Pair) -> Optional[bool]:
    # MAX, MIN and integer results do not depend on the order; float sums and products do.
    return True if op in (RED.MAX, RED.MIN) or not dtype.is_floating_point else None


def ops_valid(dtype: torch.dtype) -> List[Any]:
    ops = [RED.SUM, RED.MAX, RED.MIN, RED.PRODUCT]
    if dtype.is_floating_point:
        ops.append(RED.AVG)
    else:
        ops += list(BITWISE)
    return ops


def check_reductions(p: Pair) -> None:
    """all_reduce (every ReduceOp, blocking, async, non-contiguous, PREMUL_SUM), coalesced forms,
    reduce to every root, reduce_scatter in its three forms."""
    seed = 100
    for dtype in FLOATS + INTS + [torch.bool]:
        for op in ops_valid(dtype) if dtype != torch.bool else [RED.SUM, RED.MAX, RED.MIN, *BITWISE]:
            seed += 1

            def ar(group: Any, op: Any = op, dtype: torch.dtype = dtype, seed: int = seed) -> torch.Tensor:
                t = data(seed, (37,), dtype, p.me)
                dist.all_reduce(t, op=op, group=group)
                return t

            p.both(f"all_reduce {dtype} {op}", ar, exact_for(op, dtype, p))

    # PREMUL_SUM (NCCL's; Gloo refuses it): each input scaled, then summed.
    t = data(1, (33,), torch.float32, p.me)
    dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.5), group=p.s)
    ref = data(1, (33,), torch.float32, p.me) * 0.5
    dist.all_reduce(ref, group=p.g)
    p.same("all_reduce PREMUL_SUM(0.5)", t, ref)

    # Asynchronous, with a callback chained on the future (what DDP's hooks do).
    def ar_async(group: Any) -> torch.Tensor:
        t = data(2, (1000,), torch.float32, p.me)
        fut = dist.all_reduce(t, group=group, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0] * 2).wait()

    p.both("all_reduce async + then", ar_async)

    # A non-contiguous tensor (a transposed view): staged by symm's backend, as Gloo takes it.
    def ar_strided(group: Any) -> torch.Tensor:
        base = data(3, (6, 4), torch.float32, p.me)
        t = base.t()
        dist.all_reduce(t, op=RED.MAX, group=group)
        return base

    p.both("all_reduce of a transposed view", ar_strided, exact=True)

    def ar_coalesced(group: Any) -> List[torch.Tensor]:
        ts = [data(4 + i, (5 + i,), torch.float32, p.me) for i in range(3)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # "will be deprecated": still torch's API
            dist.all_reduce_coalesced(ts, group=group)
        return ts

    p.both("all_reduce_coalesced", ar_coalesced)

    def ar_manager(group: Any) -> List[torch.Tensor]:
        # The coalescing manager hands the backend one allreduce_coalesced.
        ts = [data(8 + i, (9,), torch.int32, p.me) for i in range(2)]
        with dist._coalescing_manager(group=group):
            for t in ts:
                dist.all_reduce(t, op=RED.BXOR, group=group)
        return ts

    p.both("_coalescing_manager all_reduce (BXOR)", ar_manager, exact=True)

    for root in range(p.n):
        for op, dtype in [(RED.SUM, torch.float32), (RED.PRODUCT, torch.int64), (RED.MIN, torch.bfloat16)]:

            def reduce(group: Any, root: int = root, op: Any = op, dtype: torch.dtype = dtype) -> torch.Tensor:
                t = data(20 + root, (17,), dtype, p.me)
                dist.reduce(t, dst=p.peer(root), op=op, group=group)
                # Only the root's tensor is specified; the others keep theirs (Gloo's too).
                return t if p.me == root else data(20 + root, (17,), dtype, p.me)

            p.both(f"reduce to {root} {op} {dtype}", reduce, exact_for(op, dtype, p))

    for op, dtype in [(RED.SUM, torch.float32), (RED.MAX, torch.float16), (RED.PRODUCT, torch.int32)] + [
        (RED.BOR, torch.int64),
        (RED.AVG, torch.float32),
    ]:

        def rs_list(group: Any, op: Any = op, dtype: torch.dtype = dtype) -> torch.Tensor:
            out = torch.empty(6, dtype=dtype)
            dist.reduce_scatter(out, [data(30 + i, (6,), dtype, p.me) for i in range(p.n)], op=op, group=group)
            return out

        def rs_tensor(group: Any, op: Any = op, dtype: torch.dtype = dtype) -> torch.Tensor:
            out = torch.empty(3, 2, dtype=dtype)
            dist.reduce_scatter_tensor(out, data(40, (p.n * 3, 2), dtype, p.me), op=op, group=group)
            return out

        p.both(f"reduce_scatter (list) {op} {dtype}", rs_list, exact_for(op, dtype, p))
        p.both(f"reduce_scatter_tensor {op} {dtype}", rs_tensor, exact_for(op, dtype, p))

    def rs_manager(group: Any) -> List[torch.Tensor]:
        outs = [torch.empty(4), torch.empty(2)]
        with dist._coalescing_manager(group=group):
            for i, out in enumerate(outs):
                dist.reduce_scatter_tensor(out, data(50 + i, (p.n * out.numel(),), torch.float32, p.me), group=group)
        return outs

    p.both("_coalescing_manager reduce_scatter_tensor", rs_manager)

    # PREMUL_SUM in reduce_scatter_tensor: the caller's input is left as it was.
    inp = data(60, (p.n * 4,), torch.float32, p.me)
    out = torch.empty(4)
    dist.reduce_scatter_tensor(out, inp, op=dist._make_nccl_premul_sum(2.0), group=p.s)
    ref = torch.empty(4)
    dist.reduce_scatter_tensor(ref, inp * 2.0, group=p.g)
    p.same("reduce_scatter_tensor PREMUL_SUM(2)", out, ref)
    p.same("reduce_scatter_tensor PREMUL_SUM input", inp, data(60, (p.n * 4,), torch.float32, p.me), exact=True)


def check_movement(p: Pair) -> None:
    """allgather in its four forms, gather, scatter, alltoall (list, single, uneven splits),
    broadcast; dtypes symm does not know travel as bytes."""
    for dtype in [torch.float32, torch.int64, torch.bool, torch.complex64]:

        def ag(group: Any, dtype: torch.dtype = dtype) -> List[torch.Tensor]:
            outs = [torch.empty(5, dtype=dtype) for _ in range(p.n)]
            dist.all_gather(outs, data(70, (5,), dtype, p.me), group=group)
            return outs

        p.both(f"all_gather {dtype}", ag, exact=True)

    def ag_tensor(group: Any) -> torch.Tensor:
        out = torch.empty(p.n * 3, 2, dtype=torch.bfloat16)
        dist.all_gather_into_tensor(out, data(71, (3, 2), torch.bfloat16, p.me), group=group)
        return out

    p.both("all_gather_into_tensor", ag_tensor, exact=True)

    def ag_coalesced(group: Any) -> List[torch.Tensor]:
        outs = [[torch.empty(3), torch.empty(2, 2)] for _ in range(p.n)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            dist.all_gather_coalesced(
                outs, [data(72, (3,), torch.float32, p.me), data(73, (2, 2), torch.float32, p.me)], group
            )
        return [t for row in outs for t in row]

    p.both("all_gather_coalesced", ag_coalesced, exact=True)

    def ag_manager(group: Any) -> List[torch.Tensor]:
        outs = [torch.empty(p.n * 4), torch.empty(p.n * 3, dtype=torch.int32)]
        with dist._coalescing_manager(group=group):
            dist.all_gather_into_tensor(outs[0], data(74, (4,), torch.float32, p.me), group=group)
            dist.all_gather_into_tensor(outs[1], data(75, (3,), torch.int32, p.me), group=group)
        return outs

    p.both("_coalescing_manager all_gather_into_tensor", ag_manager, exact=True)

    for root in range(p.n):

        def gather(group: Any, root: int = root) -> List[torch.Tensor]:
            outs = [torch.zeros(4) for _ in range(p.n)] if p.me == root else None
            dist.gather(data(80, (4,), torch.float32, p.me), outs, dst=p.peer(root), group=group)
            return outs if outs is not None else []

        def scatter(group: Any, root: int = root) -> torch.Tensor:
            ins = [data(81 + i, (2, 3), torch.float64, root) for i in range(p.n)] if p.me == root else None
            out = torch.empty(2, 3, dtype=torch.float64)
            dist.scatter(out, ins, src=p.peer(root), group=group)
            return out

        def broadcast(group: Any, root: int = root) -> List[torch.Tensor]:
            a = data(90, (9,), torch.float16, p.me)
            b = data(91, (3, 3), torch.complex64, p.me)
            dist.broadcast(a, src=p.peer(root), group=group)
            dist.broadcast(b, src=p.peer(root), group=group)
            return [a, b]

        p.both(f"gather to {root}", gather, exact=True)
        p.both(f"scatter from {root}", scatter, exact=True)
        p.both(f"broadcast from {root}", broadcast, exact=True)

    # uint16: Gloo does not move it ("Invalid scalar type"); symm moves its bytes.
    t = data(92, (7,), torch.uint16, p.me)
    dist.broadcast(t, src=p.peer(p.n - 1), group=p.s)
    p.same("broadcast uint16", t, data(92, (7,), torch.uint16, p.n - 1), exact=True)
    outs = [torch.empty(3, dtype=torch.uint16) for _ in range(p.n)]
    dist.all_gather(outs, data(93, (3,), torch.uint16, p.me), group=p.s)
    p.same("all_gather uint16", outs, [data(93, (3,), torch.uint16, r) for r in range(p.n)], exact=True)

    def a2a_list(group: Any) -> List[torch.Tensor]:
        ins = [data(100 + j, (3,), torch.float32, p.me) for j in range(p.n)]
        outs = [torch.empty(3) for _ in range(p.n)]
        dist.all_to_all(outs, ins, group=group)
        return outs

    # Different sizes per peer (Gloo refuses them; the reference is built here): group rank i
    # sends i + j + 1 elements to rank j.
    outs = [torch.empty(i + p.me + 1) for i in range(p.n)]
    dist.all_to_all(outs, [data(103 + j, (p.me + j + 1,), torch.float32, p.me) for j in range(p.n)], group=p.s)
    want = [data(103 + p.me, (i + p.me + 1,), torch.float32, i) for i in range(p.n)]
    p.same("all_to_all (list) of different sizes", outs, want, exact=True)

    def a2a_single(group: Any) -> torch.Tensor:
        out = torch.empty(p.n * 2, 3, dtype=torch.int32)
        dist.all_to_all_single(out, data(101, (p.n * 2, 3), torch.int32, p.me), group=group)
        return out

    def a2a_uneven(group: Any) -> torch.Tensor:
        # Rank i sends (i + j) % 3 rows to rank j.
        send = [(p.me + j) % 3 for j in range(p.n)]
        recv = [(i + p.me) % 3 for i in range(p.n)]
        out = torch.empty(sum(recv), 2, dtype=torch.complex64)
        dist.all_to_all_single(out, data(102, (sum(send), 2), torch.complex64, p.me), recv, send, group=group)
        return out

    p.both("all_to_all (list)", a2a_list, exact=True)
    p.both("all_to_all_single", a2a_single, exact=True)
    p.both("all_to_all_single with split sizes", a2a_uneven, exact=True)


def check_messages(p: Pair) -> None:
    """send/recv (tags ignored: messages between two ranks are matched in order), isend/irecv,
    batch_isend_irecv with messages larger than the receivers' mailboxes, barrier."""
    nxt, prv = p.peer((p.me + 1) % p.n), p.peer((p.me - 1) % p.n)

    def ring(group: Any) -> List[torch.Tensor]:
        got = torch.empty(6)
        if p.me % 2 == 0:
            dist.send(data(110, (6,), torch.float32, p.me), nxt, group=group, tag=3)
            dist.recv(got, prv, group=group, tag=3)
        else:
            dist.recv(got, prv, group=group, tag=3)
            dist.send(data(110, (6,), torch.float32, p.me), nxt, group=group, tag=3)
        small = torch.empty(4, dtype=torch.int64)
        works = [
            dist.isend(data(111, (4,), torch.int64, p.me), nxt, group=group),
            dist.irecv(small, prv, group=group),
        ]
        for w in works:
            w.wait()
        return [got, small]

    def batch(group: Any) -> torch.Tensor:
        # 2 MiB each way: beyond symm's mailboxes, so that the send and the receive must move
        # together (the batch's send and receive go as one shmem_sendrecv).
        big = torch.empty(1 << 19)
        ops = [
            dist.P2POp(dist.isend, data(112, (1 << 19,), torch.float32, p.me), nxt, group),
            dist.P2POp(dist.irecv, big, prv, group),
        ]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        return big

    if p.n > 1:
        p.both("send/recv and isend/irecv around the ring", ring, exact=True)
        p.both("batch_isend_irecv of 2 MiB around the ring", batch, exact=True)
    dist.barrier(group=p.s)
    dist.barrier(group=p.s, async_op=True).wait()


def check_works(p: Pair) -> None:
    """The backend's own work object, and what torch 2.15 makes of it."""
    import symm.c10d

    t = data(120, (8,), torch.float32, p.me)
    work = dist.all_reduce(t, group=p.s, async_op=True)
    work.wait()
    fut = work.get_future()
    assert fut.done() and fut.value()[0] is t, fut
    # torch 2.15 wraps a Python backend's work (PyWorkHolder), forwarding wait and get_future only.
    assert type(work) is dist.Work and work.is_completed() is False, (type(work), work.is_completed())

    backend = p.s._get_backend(torch.device("cpu"))
    assert isinstance(backend, symm.c10d.SymmBackend) and backend.getBackendName() == "symm", backend
    opts = dist.AllreduceOptions()
    opts.reduceOp = RED.MAX
    own = backend.allreduce([t], opts)
    assert isinstance(own, symm.c10d.SymmWork), type(own)
    assert own.wait() is True and own.is_completed() and own.is_success() and own.exception() is None
    assert own.get_future() is own.get_future() and own.get_future().value()[0] is t
    assert own.result() == [t]


def ops_on_the_symm_world(rank: int, world: int) -> None:
    """``init_process_group("symm")`` (SYMM_TEST_BACKEND=symm): every operation on the world and
    on a sub-group of two members in another order, each against Gloo."""
    assert dist.get_backend() == "symm", dist.get_backend()
    gloo_world = dist.new_group(backend="gloo")
    p = Pair(dist.group.WORLD, gloo_world, list(range(world)), rank)
    for check in (check_reductions, check_movement, check_messages, check_works):
        check(p)
    # Group rank 0 is global rank 3: symm's native group follows the group's order.
    members = [3, 1]
    sub_s = dist.new_group(members, sort_ranks=False)
    sub_g = dist.new_group(members, backend="gloo", sort_ranks=False)
    if rank in members:
        assert dist.get_backend(sub_s) == "symm"
        q = Pair(sub_s, sub_g, members, rank)
        for check in (check_reductions, check_movement, check_messages):
            check(q)
        print(f"rank {rank}: {p.checked} results on the world, {q.checked} on {members} equal Gloo's", flush=True)
    dist.barrier()


def ops_on_a_gloo_world(rank: int, world: int) -> None:
    """A Gloo world: a "symm" group of the whole world starts symm by itself (every rank builds
    it), then a "symm" sub-group serves its members; every operation against Gloo."""
    import symm

    assert not symm.is_initialized()
    everyone = dist.new_group(backend="symm")
    assert symm.is_initialized() and dist.get_backend(everyone) == "symm"
    t = torch.full((3,), float(rank))
    dist.all_reduce(t, group=everyone)
    assert torch.equal(t, torch.full((3,), float(sum(range(world))))), t
    members = [0, 2]
    sub_s = dist.new_group(members, backend="symm")
    sub_g = dist.new_group(members)
    if rank in members:
        q = Pair(sub_s, sub_g, members, rank)
        for check in (check_reductions, check_movement, check_messages, check_works):
            check(q)
        print(f"rank {rank}: {q.checked} results on {members} equal Gloo's", flush=True)
    # symm's own calls on the same group object work alongside.
    if rank in members:
        u = torch.ones(2)
        symm.shmem_allreduce(u, "sum", group=sub_s)
        assert torch.equal(u, torch.full((2,), 2.0)), u
    dist.barrier()


def expect_backend_error(fn: Callable[[], Any], *needles: str) -> str:
    try:
        fn()
    except dist.DistBackendError as e:
        text = str(e)
        for n in needles:
            assert n in text, f"DistBackendError lacks {n!r}: {text}"
        return text
    raise AssertionError(f"no DistBackendError (expected one mentioning {needles})")


def errors_and_timeouts(rank: int, world: int) -> None:
    """2 ranks, Gloo world: refusals name the op and the value, a rank-local refusal fails its
    peer at once, and waits end at the process group's timeout (or the call's own)."""
    import symm

    assert world == 2
    # A "symm" group of part of the world before symm runs: refused at once, saying what to do
    # (the other rank is not building the group and could not join symm's start-up).
    if rank == 0:
        expect_backend_error(
            lambda: dist.new_group([0], backend="symm", use_local_synchronization=True),
            "symm is not started",
            "call symm.init() on every rank first",
        )
    dist.barrier()
    symm.init()
    g = dist.new_group(backend="symm", timeout=datetime.timedelta(seconds=2))
    x = torch.ones(4)

    # Refused on every rank alike, naming the op and the dtype (Gloo's words).
    expect_backend_error(lambda: dist.all_reduce(x, op=RED.BAND, group=g), "ReduceOp.BAND", "torch.float32")
    expect_backend_error(lambda: dist.all_reduce(x, op=RED.BXOR, group=g), "ReduceOp.BXOR", "non-integral")
    expect_backend_error(
        lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=RED.AVG, group=g), "allreduce", "avg"
    )
    expect_backend_error(lambda: dist.recv(x, group=g), "recv from any source", "pass src")
    expect_backend_error(
        lambda: dist.all_to_all_single(torch.empty(4), torch.ones(4), [1, 2], [2, 2], group=g),
        "output_split_sizes = [1, 2]",
        "Split sizes doesn't match total dim 0 size",
    )
    backend = g._get_backend(torch.device("cpu"))
    opts = dist.BroadcastOptions()
    opts.rootRank = 5
    expect_backend_error(lambda: backend.broadcast([x], opts), "broadcast", "invalid root rank: 5")

    # Refused on one rank only: that rank names its argument, its peer fails at once
    # (PeerRejected) instead of waiting for the timeout.
    t0 = time.monotonic()
    bad = torch.empty(5) if rank == 0 else torch.empty(8)
    text = expect_backend_error(
        lambda: dist.all_gather_into_tensor(bad, torch.ones(4), group=g), "all_gather_into_tensor"
    )
    assert ("output_tensor" in text) if rank == 0 else ("PeerRejected" in text), text
    outs = [torch.empty(4) for _ in range(3 if rank == 0 else 2)]
    text = expect_backend_error(lambda: dist.all_gather(outs, torch.ones(4), group=g), "allgather")
    assert ("output_tensors has 3 entries: expected 2" in text) if rank == 0 else ("PeerRejected" in text), text
    assert time.monotonic() - t0 < 1.5, f"a refusal took {time.monotonic() - t0:.1f} s"

    # What the collective itself finds (arguments that differ between the ranks) comes from the
    # work: wait() raises DistBackendError with symm's Mismatch in it; the future, as any torch
    # future whose Python callback failed, a RuntimeError that names it.
    odd = torch.ones(4, dtype=torch.float32 if rank == 0 else torch.float64)
    expect_backend_error(dist.all_reduce(odd, group=g, async_op=True).wait, "Mismatch", "float64")
    fut = dist.all_reduce(odd, group=g, async_op=True).get_future()
    try:
        fut.wait()
        raise AssertionError("the future of a failed all_reduce completed")
    except RuntimeError as e:
        assert "DistBackendError: symm backend: allreduce" in str(e) and "Mismatch" in str(e), e

    # The group still works.
    y = torch.full((3,), float(rank + 1))
    dist.all_reduce(y, group=g)
    assert torch.equal(y, torch.full((3,), 3.0)), y
    # Under SYMM_VALIDATE=1 (this test's setting) the interop guard leaves a "symm" group's
    # operations to symm itself: a tensor whose asynchronous all_reduce was waited for is free
    # again (torch's wrapped work never reports is_completed(), so the guard cannot tell).
    assert os.environ.get("SYMM_VALIDATE") == "1"
    dist.all_reduce(y, group=g, async_op=True).wait()
    dist.all_reduce(y, group=g)
    assert torch.equal(y, torch.full((3,), 12.0)), y

    # The process group's timeout (2 s, below SYMMETRIC_MEMORY_TIMEOUT) bounds a blocking
    # all_reduce whose peer comes late; the operation stays in flight and completes when the
    # peer arrives, and the group goes on.
    store = dist.distributed_c10d._get_default_store()
    z = torch.full((2,), float(rank + 1))
    if rank == 0:
        t0 = time.monotonic()
        expect_backend_error(lambda: dist.all_reduce(z, group=g), "allreduce", "not completed within 2.0 s")
        took = time.monotonic() - t0
        assert 1.5 < took < 6, f"the timeout took {took:.1f} s"
        store.set("c10d-timeout-seen", "1")
    else:
        store.wait(["c10d-timeout-seen"])
        dist.all_reduce(z, group=g)
        assert torch.equal(z, torch.full((2,), 3.0)), z
    w = torch.full((2,), 5.0)
    dist.all_reduce(w, group=g)
    assert torch.equal(w, torch.full((2,), 10.0)), w
    if rank == 0:
        assert torch.equal(z, torch.full((2,), 3.0)), z  # completed in the background

    # An operation's own timeout option wins over the group's (here 30 min).
    slow = dist.new_group(backend="symm")
    backend = slow._get_backend(torch.device("cpu"))
    opts = dist.AllreduceOptions()
    opts.timeout = datetime.timedelta(seconds=1)
    v = torch.ones(3)
    if rank == 0:
        t0 = time.monotonic()
        work = backend.allreduce([v], opts)
        expect_backend_error(work.wait, "not completed within 1.0 s")
        assert 0.7 < time.monotonic() - t0 < 5, time.monotonic() - t0
        store.set("c10d-option-seen", "1")
    else:
        store.wait(["c10d-option-seen"])
        dist.all_reduce(v, group=slow)
    dist.barrier(group=slow)
    dist.barrier()


# --------------------------------------------------------------------------------------------
# Training: DDP, FSDP2, a 2-D DeviceMesh; the same steps over "symm" and over "gloo"
# --------------------------------------------------------------------------------------------


def mlp() -> torch.nn.Module:
    """About 0.92 M parameters (3.7 MB of gradients): several buckets, little work for 2 cores."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 1024),
        torch.nn.ReLU(),
        torch.nn.Linear(1024, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 256),
    )


def train_ddp(rank: int, group: Any, hook: bool, steps: int = 20, comm_hook: Any = None) -> List[torch.Tensor]:
    """DDP training of ``mlp()``: with ``hook``, ``comm_hook`` (default: the fp16 compression)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    # A 0.25 MB cap: three buckets once DDP has rebuilt them after the first step.
    model = DDP(mlp(), process_group=group, bucket_cap_mb=0.25)
    if hook:
        model.register_comm_hook(group, comm_hook or fp16_compress_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(steps):
        x = torch.randn(16, 256, generator=torch.Generator().manual_seed(100 * step + rank))
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    buckets = model._get_ddp_logging_data()["rebuilt_bucket_sizes"].split(",")
    assert len(buckets) == 3, buckets
    return [p.detach().clone() for p in model.parameters()]


def compare_params(rank: int, what: str, a: List[torch.Tensor], b: List[torch.Tensor], tol: float) -> float:
    worst = max((x - y).abs().max().item() for x, y in zip(a, b))
    if tol == 0:
        assert all(same_bits(x, y) for x, y in zip(a, b)), f"rank {rank}, {what}: differ (max |d| {worst:.3g})"
    else:
        assert worst <= tol, f"rank {rank}, {what}: max |symm - gloo| = {worst:.3g} > {tol}"
    print(f"rank {rank}: {what}: max |symm - gloo| = {worst:.3g} (allowed {tol})", flush=True)
    return worst


def replicas_agree(params: List[torch.Tensor], group: Any) -> None:
    flat = torch.cat([p.flatten() for p in params])
    outs = [torch.empty_like(flat) for _ in range(dist.get_world_size(group))]
    dist.all_gather(outs, flat, group=group)
    assert all(same_bits(o, flat) for o in outs), "DDP replicas differ"


#: DDP with fp16 compression on 4 ranks: symm sums each bucket's four fp16 gradients in float32
#: in group-rank order and rounds once; Gloo adds them in fp16 in its ring's order, rounding each
#: partial sum. A gradient may differ by an fp16 ulp or two (~1e-3 of it), which 20 SGD steps at
#: lr 0.05 turn into parameter differences of about 2e-7 (measured); the bound leaves 50x.
DDP_FP16_TOLERANCE_4 = 1e-5


#: DDP with symm's hook on 4 ranks against DDP over Gloo: symm averages each gradient as
#: (((r0 + r1) + r2) + r3) / 4, Gloo adds the quarters in its ring's order; a gradient may differ
#: in its last bit (~6e-8 of it), which 20 SGD steps at lr 0.05 keep far below this bound.
DDP_AVG_TOLERANCE_4 = 1e-6


def train_2(rank: int, world: int) -> None:
    """2 ranks, Gloo world with a "symm" group of both: DDP (three buckets, plain and with the
    fp16 compression hook) and FSDP2 over "symm" equal the same training over Gloo bit for bit."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    assert world == 2
    sg = dist.new_group(backend="symm")
    for hook in (False, True):
        a = train_ddp(rank, sg, hook)
        b = train_ddp(rank, None, hook)
        compare_params(rank, f"DDP{' + fp16_compress_hook' if hook else ''}, 2 ranks", a, b, 0.0)
        replicas_agree(a, None)

    def fsdp(mesh: Any) -> List[torch.Tensor]:
        model = mlp()
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for step in range(5):
            x = torch.randn(8, 256, generator=torch.Generator().manual_seed(100 * step + rank))
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        return [p.full_tensor().detach() for p in model.parameters()]

    a = fsdp(DeviceMesh.from_group(sg, "cpu"))
    b = fsdp(DeviceMesh.from_group(dist.group.WORLD, "cpu"))
    compare_params(rank, "FSDP2 (fully_shard), 2 ranks", a, b, 0.0)


def train_4(rank: int, world: int) -> None:
    """4 ranks, init_process_group("symm"): DDP with the fp16 hook against a Gloo group (within
    DDP_FP16_TOLERANCE_4), DDP with symm.ddp.allreduce_hook against DDP over Gloo (within
    DDP_AVG_TOLERANCE_4), and a 2-D DP x TP DeviceMesh (tensor parallel + FSDP2) over "symm"
    against the same mesh over Gloo, bit for bit (every mesh group has two members)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    assert world == 4 and dist.get_backend() == "symm"
    gg = dist.new_group(backend="gloo")
    a = train_ddp(rank, None, True)
    b = train_ddp(rank, gg, True)
    compare_params(rank, "DDP + fp16_compress_hook, 4 ranks", a, b, DDP_FP16_TOLERANCE_4)
    replicas_agree(a, gg)
    from symm.ddp import allreduce_hook

    a = train_ddp(rank, None, True, comm_hook=allreduce_hook)
    b = train_ddp(rank, gg, False)
    compare_params(rank, "DDP + symm.ddp.allreduce_hook, 4 ranks", a, b, DDP_AVG_TOLERANCE_4)
    replicas_agree(a, gg)

    def two_d(mesh: Any) -> List[torch.Tensor]:
        model = mlp()
        parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        fully_shard(model, mesh=mesh["dp"])
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        dp_rank = mesh["dp"].get_local_rank()
        for step in range(4):
            x = torch.randn(8, 256, generator=torch.Generator().manual_seed(100 * step + dp_rank))
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        return [p.full_tensor().detach() for p in model.parameters()]

    mesh_s = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    assert {dist.get_backend(mesh_s.get_group(d)) for d in ("dp", "tp")} == {"symm"}
    mesh_g = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"), backend_override={"dp": "gloo", "tp": "gloo"})
    compare_params(rank, "2-D mesh (TP + FSDP2), 4 ranks", two_d(mesh_s), two_d(mesh_g), 0.0)


class FakeBucket:
    """What ``symm.ddp.allreduce_hook`` asks of DDP's ``GradBucket``: its index and buffer."""

    def __init__(self, index: int, buffer: torch.Tensor) -> None:
        self._index, self._buffer = index, buffer

    def index(self) -> int:
        return self._index

    def buffer(self) -> torch.Tensor:
        return self._buffer


def ddp_hook(rank: int, world: int) -> None:
    """symm.ddp.allreduce_hook on 2 ranks (heap 64 MiB): DDP with the hook equals DDP over Gloo
    bit for bit, with and without gradient_as_bucket_view, and its buckets (with the view, the
    gradients too) end in symmetric memory; a bucket one member cannot move (a view into a larger
    storage) and one larger than the heap stay where they are and are averaged all the same."""
    import symm
    from symm.ddp import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    assert world == 2
    sg = dist.new_group(backend="symm")

    def train(group: Any, hook: bool, view: bool) -> Any:
        model = DDP(mlp(), process_group=group, bucket_cap_mb=0.25, gradient_as_bucket_view=view)
        if hook:
            model.register_comm_hook(group, allreduce_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for step in range(10):
            x = torch.randn(16, 256, generator=torch.Generator().manual_seed(100 * step + rank))
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
        return model

    for view in (False, True):
        a, b = train(sg, True, view), train(None, False, view)
        what = f"DDP + symm.ddp.allreduce_hook{', gradient_as_bucket_view' if view else ''}, 2 ranks"
        compare_params(rank, what, [p.detach() for p in a.parameters()], [p.detach() for p in b.parameters()], 0.0)
        if view:
            moved = [symm.is_symmetric(p.grad) for p in a.parameters()]
            assert all(moved), f"rank {rank}: gradients in symmetric memory: {moved}"

    def averaged(t: torch.Tensor, want: torch.Tensor, what: str) -> None:
        got = allreduce_hook(sg, FakeBucket(7, t)).wait()
        assert got is t and torch.equal(t, want), f"rank {rank}, {what}: {t[:4]} != {want[:4]}"
        assert not symm.is_symmetric(t), f"rank {rank}, {what}: moved"

    base = torch.arange(4096, dtype=torch.float32)
    mine = base * (rank + 1)
    # Rank 1's bucket starts one element into its storage: no member moves its bucket.
    bucket = mine.clone() if rank == 0 else torch.cat([torch.zeros(1), mine])[1:]
    for _ in range(2):  # asked once, staged from then on
        averaged(bucket, base * 1.5, "a bucket rank 1 cannot move")
        bucket.copy_(mine)
    big = torch.full((80 << 18,), float(rank))  # 80 MiB: more than the heap
    allreduce_hook(sg, FakeBucket(8, big)).wait()
    assert torch.equal(big, torch.full_like(big, 0.5)) and not symm.is_symmetric(big), f"rank {rank}: 80 MiB bucket"
    print(f"rank {rank}: ddp_hook passed", flush=True)


# --------------------------------------------------------------------------------------------
# Groups spanning (simulated) hosts: SYMM_HOST_ID puts ranks 0, 1 on host a, 2, 3 on host b
# (test_c10d.py). symm runs inside each node; between nodes the backend's private Gloo group.
# --------------------------------------------------------------------------------------------

#: DDP over the "symm" world spanning two hosts against the same training over Gloo. Not bit for
#: bit on 4 ranks: symm sums each bucket's four float32 gradients as (r0 + r1) + (r2 + r3) (each
#: node, then the nodes in order), Gloo in its ring's order; a sum may differ in its last bit
#: (~6e-8 of it), which 5 SGD steps at lr 0.05 leave far below this bound (measured: 3.7e-9).
DDP_SPANNING_TOLERANCE = 1e-6


def spans(group: Any) -> bool:
    """Whether the "symm" backend of ``group`` (None: the world) serves it across hosts (it
    then holds a private Gloo group for the messages between them)."""
    pg = dist.group.WORLD if group is None else group
    return pg._get_backend(torch.device("cpu"))._inter is not None


def spanning_symm_world(rank: int, world: int) -> None:
    """``init_process_group("symm")`` on 4 ranks of 2 hosts: every operation on the world and on a
    reordered sub-group spanning both hosts against Gloo (async ones complete when returned),
    symm's own calls on the world, and DDP against the same training over Gloo."""
    import symm

    assert world == 4 and dist.get_backend() == "symm", dist.get_backend()
    assert spans(None), "the world does not span hosts: SYMM_HOST_ID was not taken"
    gg = dist.new_group(backend="gloo")
    p = Pair(dist.group.WORLD, gg, list(range(world)), rank)
    for check in (check_reductions, check_movement, check_messages, check_works):
        check(p)
    # async: the hierarchical form runs on the calling thread, its work complete when returned.
    t = torch.full((5,), float(rank + 1))
    work = dist.all_reduce(t, async_op=True)
    assert work.get_future().done(), "an async all_reduce across hosts is complete when returned"
    work.wait()
    assert torch.equal(t, torch.full((5,), 10.0)), t
    # symm's own calls on the world (group None): their messages between hosts go on the same
    # private Gloo group, never back into the "symm" default group.
    x = torch.arange(6, dtype=torch.int64) * (rank + 1)
    symm.shmem_allreduce(x)
    assert torch.equal(x, torch.arange(6, dtype=torch.int64) * 10), x
    symm.barrier()
    # A sub-group of one member per host, in another order (its creation makes its own transport).
    members = [3, 0]
    sub_s = dist.new_group(members, sort_ranks=False)
    sub_g = dist.new_group(members, backend="gloo", sort_ranks=False)
    if rank in members:
        assert dist.get_backend(sub_s) == "symm" and spans(sub_s)
        q = Pair(sub_s, sub_g, members, rank)
        for check in (check_movement, check_messages):
            check(q)
        print(f"rank {rank}: {p.checked} results on the world, {q.checked} on {members} equal Gloo's", flush=True)
    a = train_ddp(rank, None, False, steps=5)
    b = train_ddp(rank, gg, False, steps=5)
    compare_params(rank, "DDP over a symm world spanning 2 hosts, 4 ranks", a, b, DDP_SPANNING_TOLERANCE)
    replicas_agree(a, gg)
    # symm's DDP hook on a group spanning hosts moves nothing and allreduces blocking.
    from symm.ddp import allreduce_hook

    a = train_ddp(rank, None, True, steps=5, comm_hook=allreduce_hook)
    compare_params(rank, "DDP + symm.ddp.allreduce_hook spanning 2 hosts, 4 ranks", a, b, DDP_SPANNING_TOLERANCE)
    replicas_agree(a, gg)
    dist.barrier()


def spanning_group_of_a_gloo_world(rank: int, world: int) -> None:
    """A Gloo world on 2 hosts: ``new_group([0, 1, 2, 3], backend="symm")`` spans both; async
    operations and messages on it equal Gloo's, and symm's own calls on it work alongside."""
    import symm

    sg = dist.new_group([0, 1, 2, 3], backend="symm")
    assert symm.is_initialized() and spans(sg)
    t = data(130, (1001,), torch.int64, rank)
    want = t.clone()
    dist.all_reduce(want)
    work = dist.all_reduce(t, group=sg, async_op=True)
    work.wait()
    assert same_bits(t, want), f"rank {rank}: async all_reduce {t[:6]} vs gloo {want[:6]}"
    f = data(131, (2, 7), torch.float32, rank)
    out, ref = torch.empty(world * 2, 7), torch.empty(world * 2, 7)
    dist.all_gather_into_tensor(out, f, group=sg, async_op=True).wait()
    dist.all_gather_into_tensor(ref, f)
    assert same_bits(out, ref), f"rank {rank}: async all_gather_into_tensor"
    # A ring of isend/irecv: 0 -> 1 inside host a, 1 -> 2 across, ...; none waits for another.
    got = torch.empty(9, dtype=torch.float64)
    works = [
        dist.isend(data(132, (9,), torch.float64, rank), (rank + 1) % world, group=sg),
        dist.irecv(got, (rank - 1) % world, group=sg),
    ]
    for w in works:
        w.wait()
    assert same_bits(got, data(132, (9,), torch.float64, (rank - 1) % world)), f"rank {rank}: ring {got}"
    u = torch.ones(3)
    symm.shmem_allreduce(u, "sum", group=sg)
    assert torch.equal(u, torch.full((3,), 4.0)), u
    dist.barrier(group=sg, async_op=True).wait()
    print(f"rank {rank}: async operations on a symm group spanning 2 hosts equal Gloo's", flush=True)
    dist.barrier()
