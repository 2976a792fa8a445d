"""Groups whose members lie on several (simulated) hosts: every collective runs hierarchically
(symm inside each node, gloo between nodes) and must give what gloo gives on the same ranks,
bit-identical on every member; one-sided calls across hosts are refused by name.

Run by worker.py as ``scenarios_hier.<name>`` with ``SYMM_HOST_ID`` set per rank (test_hierarchical.py):
``HIER_HOSTS`` is the number of ranks on each host, e.g. ``2,2`` or ``3,1``.
"""

from __future__ import annotations

import os
from functools import partial

import torch
import torch.distributed as dist

import symm
from scenarios import expect
from scenarios_coll import data, everywhere_identical

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64]
OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN, "avg": None}


def hosts():
    """The host of each rank, as the test set SYMM_HOST_ID."""
    sizes = [int(s) for s in os.environ["HIER_HOSTS"].split(",")]
    return [h for h, size in enumerate(sizes) for _ in range(size)]


def gloo_reduce(x, op, group):
    """Gloo's allreduce of ``x`` (avg: gloo's sum in f64 divided by the group size, rounded once)."""
    if op == "avg":
        wide = x.to(torch.float64, copy=True)
        dist.all_reduce(wide, group=group)
        return (wide / dist.get_world_size(group)).to(x.dtype)
    ref = x.clone()
    dist.all_reduce(ref, op=OPS[op], group=group)
    return ref


def check(got, want, what):
    if got.dtype.is_floating_point and "avg" in what:
        # Two roundings may differ in the last place (symm: f32 sum / n; the reference: f64).
        ok = torch.allclose(got.double(), want.double(), rtol=2 ** -7 if got.element_size() == 2 else 1e-6, atol=0)
    else:
        ok = torch.equal(got, want)
    assert ok, f"{what}: symm {got[:8].tolist()} != gloo {want[:8].tolist()}"


def collectives_on(rank, group, members, sizes):
    """Every collective on ``group`` (global ranks ``members``) against gloo on the same group."""
    n, me = len(members), members.index(rank)
    where = f"group {members}"
    for dtype in DTYPES:
        for m in sizes:
            for op in OPS:
                if op == "avg" and not dtype.is_floating_point:
                    ints = data(me, m, dtype)
                    expect(symm.InvalidArgument, partial(symm.shmem_allreduce, ints, "avg", group), "op", "avg")
                    continue
                x = data(me, m, dtype, salt=m)
                want = gloo_reduce(x, op, group)
                symm.shmem_allreduce(x, op, group=group)
                check(x, want, f"allreduce {op} {dtype} x{m} {where}")
                assert everywhere_identical(x, group), f"allreduce {op} {dtype} {where}: ranks differ"
                # reduce_scatter: the parts of the same reduction
                inp = torch.cat([data(me, m, dtype, salt=q) for q in range(n)])
                out = torch.empty(m, dtype=dtype)
                symm.shmem_reduce_scatter(out, inp, op, group=group)
                want = gloo_reduce(inp, op, group)[me * m : (me + 1) * m]
                check(out, want, f"reduce_scatter {op} {dtype} x{m} {where}")
            # allgather, against gloo's
            inp = data(me, m, dtype, salt=7)
            out, want = torch.empty(n * m, dtype=dtype), torch.empty(n * m, dtype=dtype)
            symm.shmem_allgather(out, inp, group=group)
            dist.all_gather_into_tensor(want, inp, group=group)
            check(out, want, f"allgather {dtype} x{m} {where}")
            # broadcast from every member
            for src in range(n):
                t = data(me, m, dtype, salt=src)
                want = t.clone()
                dist.broadcast(want, group_src=src, group=group)
                symm.shmem_broadcast(t, src, group=group)
                check(t, want, f"broadcast from {src} {dtype} x{m} {where}")
    # low-precision transport inside each node: exact for these small integers
    x = data(me, 1000, torch.float32)
    want = gloo_reduce(x, "sum", group)
    symm.shmem_allreduce(x, "sum", group=group, low_precision_dtype=torch.bfloat16)
    check(x, want, f"allreduce via bfloat16 {where}")
    assert everywhere_identical(x, group)
    # alltoall(v): rank i sends (i + 2 j) % 5 + 1 elements to rank j
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        count = lambda i, j: (i + 2 * j) % 5 + 1  # noqa: E731
        sends = [data(me, count(me, j), dtype, salt=j) for j in range(n)]
        receive_list = [count(i, me) for i in range(n)]
        recv = torch.full((sum(receive_list) + 3,), -1).to(dtype)
        symm.shmem_alltoall(sends, recv, receive_list, group=group)
        want = torch.empty(sum(receive_list), dtype=dtype)
        dist.all_to_all_single(
            want, torch.cat(sends), receive_list, [s.numel() for s in sends], group=group
        )
        check(recv[: want.numel()], want, f"alltoall {dtype} {where}")
        assert recv[want.numel() :].eq(-1).all(), "alltoall wrote past receive_list"
    # messages: a ring (sendrecv), then every pair both ways (send / recv)
    nxt, prv = (me + 1) % n, (me - 1) % n
    got = torch.empty(333, dtype=torch.bfloat16)
    symm.shmem_sendrecv(data(me, 333, torch.bfloat16), nxt, got, prv, group=group)
    check(got, data(prv, 333, torch.bfloat16), f"sendrecv ring {where}")
    for a in range(n):
        for b in range(n):
            if a == b or me not in (a, b):
                continue
            if me == a:
                symm.shmem_send(data(a, 70, torch.int32, salt=b), b, group=group)
            else:
                got = torch.empty(70, dtype=torch.int32)
                symm.shmem_recv(got, a, group=group)
                check(got, data(a, 70, torch.int32, salt=b), f"send {a} -> {b} {where}")
    symm.barrier(group=group)


def hierarchical(rank, world):
    host = hosts()
    first, second = [r for r in range(world) if host[r] == 0], [r for r in range(world) if host[r] == 1]
    # Groups spanning both hosts: the world, one in an odd order (nodes of other sizes), and one
    # member of each host; and a group inside one host (symm's own path).
    spanning = [second[::-1] + first[:1], [first[-1], second[0]]]
    # (every rank makes every group, in the same order: torch's new_group is collective)
    made = {tuple(g): symm.create_group(g) for g in [*spanning, first, second]}
    # Sizes: one element, a size no node size divides, several workspace rounds (1 MiB).
    collectives_on(rank, None, list(range(world)), [1, 1001, 70001])
    for members in spanning:
        if rank in members:
            collectives_on(rank, made[tuple(members)], members, [5, 1001])
    node = first if rank in first else second
    x = torch.full((10,), float(rank))
    symm.shmem_allreduce(x, group=made[tuple(node)])
    assert x.eq(sum(node)).all(), x
    dist.barrier()
    refusals(rank, world, host, made[tuple(node)])


def refusals(rank, world, host, g):
    """One-sided calls across hosts, and symmetric allocation on a group spanning hosts (``g``:
    the group of this rank's host)."""
    names = {0: "host-a", 1: "host-b"}
    expect(symm.GroupError, lambda: symm.empty(4, torch.float32), "spans hosts", "symmetric allocation", rank=rank)
    # A symmetric tensor of this rank's node, then a put to a rank of the other host named
    # through the world (which spans both).
    buf = symm.empty(4, torch.float32, group=g)
    other = next(r for r in range(world) if host[r] != host[rank])
    why = ("no load/store path between hosts", names[host[rank]], names[host[other]], f"target_rank = {other}")
    src = torch.zeros(4)
    expect(symm.GroupError, lambda: symm.shmem_put(buf, 0, src, 0, 4, other), *why, rank=rank)
    expect(symm.GroupError, lambda: symm.shmem_get(buf, 0, src, 0, 4, other), *why, rank=rank)
    sig = symm.empty(2, torch.int64, group=g)
    expect(symm.GroupError, lambda: symm.shmem_signal_op(sig, 0, 1, "set", other), *why, rank=rank)
    expect(
        symm.GroupError, lambda: symm.shmem_put_with_signal(buf, 0, src, 0, 4, sig, 0, 1, "set", other), *why, rank=rank
    )
    # async_op on a group spanning hosts: refused by name, on every rank alike
    expect(symm.Unsupported, lambda: symm.shmem_allreduce(torch.ones(4), async_op=True), "async_op", rank=rank)
    dist.barrier()
