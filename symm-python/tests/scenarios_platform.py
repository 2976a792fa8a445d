"""Scenarios written once against symm's public API and ``fw`` (the rank's framework), run on
PyTorch by ``test_platforms.py`` (``worker.py``, gloo world) and on MindSpore by
``test_mindspore.py`` (``ms_worker.py``, a dynamic cluster): primitives, groups, every collective,
op and dtype, low precision, autograd and bad inputs, with the expected values computed in NumPy.

Data are small integers, exactly representable in every dtype, so sums, maxima and averages
over 2 or 4 ranks are exact and each result is compared for equality.
"""

from __future__ import annotations

from typing import Any, Callable, List

import numpy as np
from expect import expect
from fw import FLOATS, INTS, current

import symm

OPS = ("sum", "avg", "max", "min")

#: The jobs both platforms' tests run: the scenarios of each world size, in one job each (a job's
#: start-up costs more than most scenarios).
JOBS = {
    2: ("primitives", "low_precision", "autograd", "bad_inputs"),
    4: ("groups", "collectives", "autograd"),
}


def job(world: int) -> str:
    """The comma-separated scenario names of the job of ``world`` ranks."""
    return ",".join(f"scenarios_platform.{s}" for s in JOBS[world])


def data(rank: int, n: int, salt: int = 0) -> np.ndarray:
    """Rank ``rank``'s values: small integers, different on every rank."""
    return ((np.arange(n) * (rank + 2) + 3 * rank + salt) % 11).astype(np.float64) - 3


def reduce(values: List[np.ndarray], op: str) -> np.ndarray:
    stack = np.stack(values)
    return {"sum": stack.sum(0), "avg": stack.sum(0) / len(values), "max": stack.max(0), "min": stack.min(0)}[op]


def ops_for(dtype: str) -> tuple:
    return OPS if dtype in FLOATS else ("sum", "max", "min")


# --------------------------------------------------------------------------------------------
# primitives
# --------------------------------------------------------------------------------------------


def primitives(rank: int, world: int) -> None:
    fw = current()
    right, left = (rank + 1) % world, (rank - 1) % world
    buf = symm.empty((world, 4), fw.dtype("float32"))
    assert symm.is_symmetric(buf) and tuple(buf.shape) == (world, 4)
    sig = symm.empty(world, fw.dtype("int32"))
    fw.fill(sig, 0)
    fw.fill(buf, -1)
    symm.barrier()
    # put_with_signal into the right neighbour's row `rank`, wait for the left one's.
    symm.shmem_put_with_signal(buf, rank * 4, fw.tensor([rank + 1] * 4, "float32"), 0, 4, sig, rank, 1, "set", right)
    symm.shmem_wait_for_signal(buf, sig, left, 1, "eq")
    got = fw.numpy(buf)
    assert (got[left] == left + 1).all() and (got[rank] == -1).all(), got

    for dt in FLOATS + INTS + ("int8", "uint8"):
        b = symm.empty(world, fw.dtype(dt))
        fw.fill(b, 0)
        symm.barrier()
        symm.shmem_put(b, rank, fw.tensor([rank + 1], dt), 0, 1, right)  # offsets count elements
        symm.barrier()
        assert fw.numpy(b)[left] == left + 1, (dt, fw.numpy(b))
        back = fw.empty((1,), dt)
        symm.shmem_get(b, rank, back, 0, 1, right)  # right's copy holds what this rank put
        assert fw.numpy(back)[0] == rank + 1, (dt, fw.numpy(back))
        symm.barrier()  # every rank has read its copy before the next put overwrites it
        work = symm.shmem_put(b, rank, fw.tensor([rank + 7], dt), 0, 1, right, async_op=True)
        work.wait()
        symm.barrier()
        assert fw.numpy(b)[left] == left + 7, (dt, fw.numpy(b))
        symm.free(b)

    counter = symm.empty(1, fw.dtype("int64"))
    fw.fill(counter, 0)
    symm.barrier()
    symm.shmem_signal_op(counter, 0, rank + 1, "add", 0)
    symm.barrier()
    if rank == 0:
        assert fw.numpy(counter)[0] == world * (world + 1) // 2, fw.numpy(counter)

    # A released tensor is refused by name.
    symm.free(buf)
    expect(symm.InvalidArgument, lambda: symm.shmem_put(buf, 0, fw.tensor([1], "float32"), 0, 1, right), "symm.free")
    symm.barrier()


# --------------------------------------------------------------------------------------------
# groups
# --------------------------------------------------------------------------------------------


def groups(rank: int, world: int) -> None:
    fw = current()
    assert world == 4
    reverse = symm.create_group([3, 2, 1, 0])  # group rank i is global rank 3 - i
    pairs = [symm.create_group([0, 1]), symm.create_group([2, 3])]
    mine, other = pairs[rank // 2], pairs[1 - rank // 2]

    # target_rank is group-local: group rank 0 of `reverse` is global rank 3.
    acc = symm.empty(world, fw.dtype("int64"), group=reverse)
    fw.fill(acc, 0)
    symm.barrier(group=reverse)
    symm.shmem_put(acc, 3 - rank, fw.tensor([rank + 10], "int64"), 0, 1, 0, group=reverse)
    symm.barrier(group=reverse)
    if rank == 3:
        assert list(fw.numpy(acc)) == [13, 12, 11, 10], fw.numpy(acc)

    # Collectives in the group order: the gather of `reverse` lists global ranks 3..0.
    out = fw.empty((world * 2,), "float32")
    symm.shmem_allgather(out, fw.tensor([rank, rank], "float32"), group=reverse)
    assert list(fw.numpy(out)) == [3, 3, 2, 2, 1, 1, 0, 0], fw.numpy(out)

    # Pairs: each pair reduces its own values only, at the same time as the other.
    x = fw.tensor(data(rank, 6), "float32")
    symm.shmem_allreduce(x, "sum", group=mine)
    base = 2 * (rank // 2)
    assert (fw.numpy(x) == data(base, 6) + data(base + 1, 6)).all(), fw.numpy(x)

    # split_group: the members [1, 0] of the pair, in that order.
    split = symm.split_group(mine, [1, 0])
    out = fw.empty((2,), "int32")
    symm.shmem_allgather(out, fw.tensor([rank], "int32"), group=split)
    assert list(fw.numpy(out)) == [base + 1, base], fw.numpy(out)

    # Out of range, and a group this rank is not in.
    expect(symm.GroupError, lambda: symm.shmem_put(acc, 0, acc, 0, 1, 9, group=reverse), "target_rank = 9",
           rank=rank, also=ValueError)
    expect(symm.GroupError, lambda: symm.shmem_allreduce(fw.tensor([1], "float32"), group=other), rank=rank)
    symm.barrier()


# --------------------------------------------------------------------------------------------
# collectives: every one, op and dtype
# --------------------------------------------------------------------------------------------


def collectives(rank: int, world: int) -> None:
    fw = current()
    n = world
    for dt in FLOATS + INTS:
        for op in ops_for(dt):
            x = fw.tensor(data(rank, 9), dt)
            symm.shmem_allreduce(x, op)
            want = reduce([data(r, 9) for r in range(n)], op)
            assert (fw.numpy(x) == want).all(), (dt, op, fw.numpy(x), want)

            out = fw.empty((3,), dt)
            symm.shmem_reduce_scatter(out, fw.tensor(data(rank, 3 * n, 1), dt), op)
            want = reduce([data(r, 3 * n, 1)[3 * rank : 3 * rank + 3] for r in range(n)], op)
            assert (fw.numpy(out) == want).all(), (dt, op, fw.numpy(out), want)

        out = fw.empty((5 * n,), dt)
        symm.shmem_allgather(out, fw.tensor(data(rank, 5, 2), dt))
        assert (fw.numpy(out) == np.concatenate([data(r, 5, 2) for r in range(n)])).all(), (dt, fw.numpy(out))

        x = fw.tensor(data(rank, 4, 3), dt)
        symm.shmem_broadcast(x, n - 1)
        assert (fw.numpy(x) == data(n - 1, 4, 3)).all(), (dt, fw.numpy(x))

    # alltoall with uneven counts: rank r sends (r + i) % 3 elements of value 10 r + i to rank i.
    for dt in ("float32", "int64", "bfloat16"):
        sends = [fw.tensor([10 * rank + i] * ((rank + i) % 3), dt) for i in range(n)]
        counts = [(i + rank) % 3 for i in range(n)]
        out = fw.empty((sum(counts),), dt)
        symm.shmem_alltoall(sends, out, counts)
        want = np.concatenate([[10 * i + rank] * ((i + rank) % 3) for i in range(n)])
        assert (fw.numpy(out) == want).all(), (dt, fw.numpy(out), want)

    # Messages: pairs (2k, 2k + 1) by send/recv, a ring by sendrecv.
    peer = rank ^ 1
    got = fw.empty((3,), "float64")
    if rank % 2 == 0:
        symm.shmem_send(fw.tensor(data(rank, 3), "float64"), peer)
        symm.shmem_recv(got, peer)
    else:
        symm.shmem_recv(got, peer)
        symm.shmem_send(fw.tensor(data(rank, 3), "float64"), peer)
    assert (fw.numpy(got) == data(peer, 3)).all(), fw.numpy(got)
    got = fw.empty((4,), "int32")
    symm.shmem_sendrecv(fw.tensor(data(rank, 4), "int32"), (rank + 1) % n, got, (rank - 1) % n)
    assert (fw.numpy(got) == data((rank - 1) % n, 4)).all(), fw.numpy(got)

    # Asynchronous: the work completes the call; its tensor is the result then.
    x = fw.tensor(data(rank, 16), "float32")
    work = symm.shmem_allreduce(x, "max", async_op=True)
    work.wait()
    assert work.is_completed()
    assert (fw.numpy(x) == reduce([data(r, 16) for r in range(n)], "max")).all()
    y = fw.tensor(data(rank, 16), "float32")
    (value,) = fw.future_value(symm.shmem_allreduce(y, "min", async_op=True).get_future())
    assert (fw.numpy(value) == reduce([data(r, 16) for r in range(n)], "min")).all()

    # A symmetric tensor goes zero-copy; the result is the same.
    s = symm.empty(8, fw.dtype("float32"))
    fw.fill(s, data(rank, 8))
    symm.shmem_allreduce(s, "sum")
    assert (fw.numpy(s) == reduce([data(r, 8) for r in range(n)], "sum")).all()
    symm.barrier()


def low_precision(rank: int, world: int) -> None:
    """Transport in a low-precision format, accumulation in float32: close to the exact sum,
    and bit-identical on every rank."""
    fw = current()
    rng = np.random.default_rng(rank)
    values = [np.random.default_rng(r).standard_normal(4096) for r in range(world)]
    exact = np.sum([v.astype(np.float32) for v in values], axis=0)
    for lp, tol in (("bfloat16", 2**-6), ("float16", 2**-9), ("float8_e4m3fn", 2**-2)):
        x = fw.tensor(values[rank].astype(np.float32), "float32")
        symm.shmem_allreduce(x, "sum", low_precision_dtype=fw.dtype(lp))
        got = fw.numpy(x)
        err = np.abs(got - exact).max() / np.abs(exact).max()
        assert 0 < err <= tol, (lp, err)  # rounded, but within the format's precision
        every = fw.empty((world * 4096,), "float32")
        symm.shmem_allgather(every, fw.tensor(got, "float32"))
        rows = fw.numpy(every).reshape(world, 4096)
        assert (rows == rows[0]).all(), f"{lp}: ranks differ"
    # The name works as well as the dtype; a bad one is refused by name.
    x = fw.tensor(rng.standard_normal(64).astype(np.float32), "float32")
    symm.shmem_allreduce(x, "sum", low_precision_dtype="bfloat16")
    expect(symm.InvalidArgument, lambda: symm.shmem_allreduce(x, "sum", low_precision_dtype="int3"),
           "low_precision_dtype", rank=rank, also=ValueError)
    symm.barrier()


# --------------------------------------------------------------------------------------------
# autograd: the RFC's duality table, against NumPy and against numerical gradients
# --------------------------------------------------------------------------------------------


def weight(rank: int, shape: tuple) -> np.ndarray:
    """The weight of rank ``rank``'s loss term, sum(y * weight)."""
    return data(rank, int(np.prod(shape)), 5).reshape(shape) + 0.5


def numeric_grad(
    fw: Any, f: Callable[[Any], Any], x: np.ndarray, out_shape: tuple, world: int, rank: int
) -> np.ndarray:
    """d(sum over ranks of sum(f(x) * weight)) / d(this rank's x), by central differences (every
    rank perturbs in turn, the ranks' losses summed by symm)."""
    eps, grad = 1e-6, np.zeros(x.size)
    for r in range(world):
        for j in range(x.size):
            total = []
            for sign in (1, -1):
                v = x.copy().reshape(-1)
                if r == rank:
                    v[j] += sign * eps
                y = f(fw.tensor(v.reshape(x.shape), "float64"))
                loss = fw.tensor([float((fw.numpy(y) * weight(rank, out_shape)).sum())], "float64")
                symm.shmem_allreduce(loss, "sum")
                total.append(fw.numpy(loss)[0])
            if r == rank:
                grad[j] = (total[0] - total[1]) / (2 * eps)
    return grad.reshape(x.shape)


def autograd(rank: int, world: int) -> None:
    import symm.functional as F

    fw = current()
    n = world
    x = data(rank, 2 * n).reshape(n, 2)

    def check(name: str, f: Callable[[Any], Any], out_shape: tuple, want: np.ndarray, numeric: bool = True) -> None:
        got = fw.grad(f, fw.tensor(x, "float64"), weight(rank, out_shape))
        assert np.allclose(got, want, rtol=0, atol=1e-12), (name, got, want)
        if numeric:
            num = numeric_grad(fw, f, x, out_shape, n, rank)
            assert np.allclose(got, num, rtol=1e-6, atol=1e-6), (name, got, num)

    w = [weight(r, (n * n, 2)) for r in range(n)]
    check("all_gather", F.all_gather, (n * n, 2), sum(w)[n * rank : n * rank + n])
    w = [weight(r, (1, 2)) for r in range(n)]
    check("reduce_scatter", F.reduce_scatter, (1, 2), np.concatenate(w))
    check("reduce_scatter avg", lambda t: F.reduce_scatter(t, "avg"), (1, 2), np.concatenate(w) / n)
    w = [weight(r, (n, 2)) for r in range(n)]
    check("all_reduce identity", F.all_reduce, (n, 2), w[rank], numeric=False)
    check("all_reduce avg identity", lambda t: F.all_reduce(t, "avg"), (n, 2), w[rank] / n, numeric=False)
    check("all_reduce all_reduce", lambda t: F.all_reduce(t, backward="all_reduce"), (n, 2), sum(w))
    # all_to_all: row k of x goes to rank k; row r of rank k's output came from rank r.
    check("all_to_all", F.all_to_all, (n, 2), np.stack([w[k][rank] for k in range(n)]))
    check("broadcast", lambda t: F.broadcast(t, 1), (n, 2), sum(w) if rank == 1 else np.zeros((n, 2)))

    # Uneven splits, the output's learned from the senders; a bad split refused by name.
    def rows(src: int, dst: int) -> int:
        return (src + dst) % 2 + 1

    def block(src: int) -> np.ndarray:
        return np.arange(2 * sum(rows(src, d) for d in range(n))).reshape(-1, 2) + 100.0 * src

    sizes = [rows(rank, d) for d in range(n)]
    got = fw.numpy(F.all_to_all(fw.tensor(block(rank), "float64"), input_split_sizes=sizes))
    want = [block(s)[sum(rows(s, d) for d in range(rank)) :][: rows(s, rank)] for s in range(n)]
    assert (got == np.concatenate(want)).all(), (got, want)
    expect(symm.InvalidArgument, lambda: F.all_to_all(fw.tensor(block(rank), "float64"), input_split_sizes=[1] * n),
           "input_split_sizes", "must sum", rank=rank, also=ValueError)
    # Not the framework's tensor: refused by name, and the group's round with it on every rank.
    expect(symm.InvalidArgument, lambda: F.all_reduce([1.0, 2.0]), "input", "<list>", "Tensor", rank=rank,
           also=ValueError)

    # send -> the copy's gradient plus what dst sends back; recv -> sends the gradient back.
    peer = rank ^ 1
    if rank % 2 == 0:
        got = fw.grad(lambda t: F.send(t, peer), fw.tensor(x, "float64"), weight(rank, (n, 2)))
        assert np.allclose(got, weight(rank, (n, 2)) + weight(peer, (n, 2))), got
    else:
        got = fw.grad(lambda t: F.recv(t, peer), fw.tensor(x, "float64"), weight(rank, (n, 2)))
        assert (got == 0).all(), got
    symm.barrier()


# --------------------------------------------------------------------------------------------
# bad inputs: named, on the rank that made them, and the group still works afterwards
# --------------------------------------------------------------------------------------------


def bad_inputs(rank: int, world: int) -> None:
    fw = current()
    right = (rank + 1) % world
    buf = symm.empty(8, fw.dtype("float32"))
    src = fw.tensor([1, 2, 3, 4], "float32")
    expect(symm.GroupError, lambda: symm.shmem_put(buf, 0, src, 0, 4, world + 2), f"target_rank = {world + 2}",
           rank=rank, also=ValueError)
    expect(symm.InvalidArgument, lambda: symm.shmem_put(buf, 6, src, 0, 4, right), "target", rank=rank,
           also=ValueError)
    plain = fw.tensor([0] * 8, "float32")
    expect(symm.InvalidArgument, lambda: symm.shmem_put(plain, 0, src, 0, 4, right), "target", "symmetric",
           rank=rank, also=ValueError)
    expect(symm.InvalidArgument, lambda: symm.shmem_allreduce("not a tensor"), "tensor", rank=rank, also=ValueError)
    expect(symm.InvalidArgument, lambda: symm.shmem_allreduce(fw.tensor([1, 2], "int32"), "avg"), "avg",
           rank=rank, also=ValueError)
    expect(symm.InvalidArgument, lambda: symm.shmem_allreduce(fw.tensor([1.0], "float32"), "median"), "op",
           rank=rank, also=ValueError)
    expect(symm.InvalidArgument, lambda: symm.empty(4, "complex128"), "dtype", rank=rank, also=ValueError)
    out = fw.empty((3,), "float32")
    expect(symm.InvalidArgument, lambda: symm.shmem_allgather(out, fw.tensor([1.0, 2.0], "float32")), "output_tensor",
           rank=rank, also=ValueError)
    # After the refusals every rank is still in step.
    x = fw.tensor([rank], "float32")
    symm.shmem_allreduce(x, "sum")
    assert fw.numpy(x)[0] == world * (world - 1) / 2
    symm.free(buf)
    symm.barrier()
