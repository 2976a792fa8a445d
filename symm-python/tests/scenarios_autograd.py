"""Autograd of the collectives, and training next to torch.distributed (run by worker.py as
``scenarios_autograd.<name>``).

gradcheck needs one function with one Jacobian, but a collective is n functions on n ranks. So
every rank runs the same *global* function of the same input ``X`` (one row per group rank,
identical on every rank: the same seed): ``Scatter`` hands rank r its row, the collective runs,
and ``Gather`` stacks every rank's output into the same global output. Both helpers use
torch.distributed (gloo), not symm, and carry the replicated convention (what follows them is
the same on every rank): Scatter's backward gathers the rows' gradients, Gather's backward keeps
this rank's row. gradcheck perturbs ``X`` identically on every rank, so its numerical Jacobian is
the global function's, and its analytical one goes through the Function under test.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

import symm
import symm.functional as F


class Scatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, X, group):
        ctx.group = group
        return X[dist.get_rank(group)].clone()

    @staticmethod
    def backward(ctx, g):
        out = [torch.empty_like(g) for _ in range(dist.get_world_size(ctx.group))]
        dist.all_gather(out, g.contiguous(), group=ctx.group)
        return torch.stack(out), None


class Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, group):
        ctx.group = group
        out = [torch.empty_like(y) for _ in range(dist.get_world_size(group))]
        dist.all_gather(out, y.contiguous(), group=group)
        return torch.stack(out)

    @staticmethod
    def backward(ctx, g):
        return g[dist.get_rank(ctx.group)].contiguous(), None


def global_input(n, *shape, seed=0):
    gen = torch.Generator().manual_seed(1234 + seed)
    return torch.randn((n,) + shape, dtype=torch.float64, generator=gen).requires_grad_()


def gradcheck(name, fn, X):
    ok = torch.autograd.gradcheck(fn, (X,), eps=1e-6, atol=1e-7, rtol=1e-5)
    assert ok, name


def splits_from(r, n):
    """Rows group rank r sends to group rank i: 1 + (r + i) % n. Every rank sends and receives
    n(n+1)/2 rows in all, so the outputs have the same shape everywhere."""
    return [1 + (r + i) % n for i in range(n)]


def ring(x, nxt, prv, group, ga):
    y = F.send(x, nxt, group)
    z = F.recv(x, prv, group=group)  # like=x: the received tensor hangs off x's graph
    return ga(torch.cat([2 * y, z**2]))


def gradchecks(group):
    n = dist.get_world_size(group)
    me = dist.get_rank(group)
    nxt, prv = (me + 1) % n, (me - 1) % n
    sc = lambda X: Scatter.apply(X, group)  # noqa: E731
    ga = lambda y: Gather.apply(y, group)  # noqa: E731
    checks = {
        "all_gather": (lambda X: ga(F.all_gather(sc(X), group)), (2, 3)),
        "all_gather 0-d": (lambda X: ga(F.all_gather(sc(X), group)), ()),
        "reduce_scatter sum": (lambda X: ga(F.reduce_scatter(sc(X), "sum", group)), (2 * n, 2)),
        "reduce_scatter avg": (lambda X: ga(F.reduce_scatter(sc(X), "avg", group)), (n, 3)),
        # replicated convention: the output is one value (the same on every rank), and what
        # follows it (gradcheck's projection) is the same on every rank: no Gather
        "all_reduce sum, identity backward": (lambda X: F.all_reduce(sc(X), "sum", group), (3, 2)),
        "all_reduce avg, identity backward": (lambda X: F.all_reduce(sc(X), "avg", group), (4,)),
        # sum-over-ranks convention: each rank's copy is a separate output
        "all_reduce sum, all_reduce backward": (
            lambda X: ga(F.all_reduce(sc(X), "sum", group, backward="all_reduce")),
            (3, 2),
        ),
        "all_reduce avg, all_reduce backward": (
            lambda X: ga(F.all_reduce(sc(X), 1, group, backward="all_reduce")),
            (4,),
        ),
        "all_to_all equal splits": (lambda X: ga(F.all_to_all(sc(X), group=group)), (n, 2)),
        "all_to_all uneven splits": (
            lambda X: ga(F.all_to_all(sc(X), None, splits_from(me, n), group)),
            (n * (n + 1) // 2, 2),
        ),
        "all_to_all uneven splits, both given": (
            lambda X: ga(F.all_to_all(sc(X), [1 + (j + me) % n for j in range(n)], splits_from(me, n), group)),
            (n * (n + 1) // 2,),
        ),
        "all_to_all list": (
            lambda X: ga(torch.cat(F.all_to_all(list(torch.split(sc(X), splits_from(me, n))), group=group))),
            (n * (n + 1) // 2, 2),
        ),
        "broadcast": (lambda X: ga(F.broadcast(sc(X), n - 1, group)), (3,)),
        # a ring: send to the next rank, receive from the previous one; the sent tensor is
        # also used locally (its gradient has both parts)
        "send/recv": (
            lambda X: ring(sc(X), nxt, prv, group, ga),
            (3,),
        ),
        # the same ring in one call, and the other direction with another shape (6 elements
        # sent, received as 2x3)
        "sendrecv": (lambda X: ga(F.sendrecv(sc(X), nxt, prv, group=group) ** 2), (3,)),
        "sendrecv, other shape": (
            lambda X: ga(F.sendrecv(sc(X).repeat(2), prv, nxt, (2, 3), group=group).tanh().flatten()),
            (3,),
        ),
    }
    for seed, (name, (fn, shape)) in enumerate(checks.items()):
        gradcheck(name, fn, global_input(n, *shape, seed=seed))


def explicit_all_reduce_conventions(group):
    """The two definitions of an all_reduce's gradient, computed by hand."""
    n = dist.get_world_size(group)
    me = dist.get_rank(group)
    x = torch.arange(4, dtype=torch.float64) + me
    w = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=torch.float64)  # the same on every rank
    w_mine = w * (me + 1)  # differs per rank
    w_all = sum(w * (r + 1) for r in range(n))

    # Replicated: one loss L = <w, y>, computed identically on every rank. dL/dx_r = w.
    for mode, want in [("identity", w), ("all_reduce", n * w)]:
        xr = x.clone().requires_grad_()
        (F.all_reduce(xr, group=group, backward=mode) * w).sum().backward()
        assert torch.equal(xr.grad, want), (mode, xr.grad, want)
    # Sum over ranks: L = sum_r <w_r, y>, each rank holding its own term. dL/dx_r = sum_r w_r.
    for mode, want in [("all_reduce", w_all), ("identity", w_mine)]:
        xr = x.clone().requires_grad_()
        (F.all_reduce(xr, group=group, backward=mode) * w_mine).sum().backward()
        assert torch.allclose(xr.grad, want), (mode, xr.grad, want)
    # So: "identity" is right when the code after the all_reduce is replicated (each rank's
    # gradient is already the whole gradient); "all_reduce" when each rank's loss is its own
    # term. For avg, the replicated gradient is w / n.
    xr = x.clone().requires_grad_()
    (F.all_reduce(xr, "avg", group=group) * w).sum().backward()
    assert torch.allclose(xr.grad, w / n)


# --------------------------------------------------------------------------------------------
# the same computations built from torch.distributed (gloo) calls
# --------------------------------------------------------------------------------------------


def global_rank(group, r):
    return r if group is None else dist.get_global_rank(group, r)


class RefAllReduceIdentity(torch.autograd.Function):
    """Megatron-LM's reduce-from-tensor-parallel-region: all_reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, op, group):
        y = x.clone()
        dist.all_reduce(y, op=op, group=group)
        ctx.scale = 1.0 / dist.get_world_size(group) if op == dist.ReduceOp.AVG else 1.0
        return y

    @staticmethod
    def backward(ctx, g):
        return g * ctx.scale, None, None


class RefAllGather(torch.autograd.Function):
    """all_gather_into_tensor forward, reduce_scatter_tensor(sum) backward.
    (torch.distributed.nn.functional.all_gather's backward fails on gloo in a group whose
    ranks differ from the global ones: it passes group ranks to a scatter that wants global.)"""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = torch.empty((dist.get_world_size(group) * x.shape[0],) + tuple(x.shape[1:]), dtype=x.dtype)
        dist.all_gather_into_tensor(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, g):
        out = torch.empty((g.shape[0] // dist.get_world_size(ctx.group),) + tuple(g.shape[1:]), dtype=g.dtype)
        dist.reduce_scatter_tensor(out, g.contiguous(), group=ctx.group)
        return out, None


class RefReduceScatterAvg(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        n = dist.get_world_size(group)
        out = torch.empty((x.shape[0] // n,) + tuple(x.shape[1:]), dtype=x.dtype)
        dist.reduce_scatter_tensor(out, x.contiguous(), op=dist.ReduceOp.AVG, group=group)
        return out

    @staticmethod
    def backward(ctx, g):
        n = dist.get_world_size(ctx.group)
        out = torch.empty((n * g.shape[0],) + tuple(g.shape[1:]), dtype=g.dtype)
        dist.all_gather_into_tensor(out, g.contiguous(), group=ctx.group)
        return out / n, None


class RefRing(torch.autograd.Function):
    """Sends x to the next group rank, receives from the previous one (gloo isend/recv);
    backward: the received tensor's gradient goes back to its sender, the sent one's arrives."""

    @staticmethod
    def forward(ctx, x, group):
        n, me = dist.get_world_size(group), dist.get_rank(group)
        ctx.nxt = global_rank(group, (me + 1) % n)
        ctx.prv = global_rank(group, (me - 1) % n)
        ctx.group = group
        z = torch.empty_like(x)
        req = dist.isend(x.contiguous(), ctx.nxt, group=group)
        dist.recv(z, ctx.prv, group=group)
        req.wait()
        return z

    @staticmethod
    def backward(ctx, g):
        back = torch.empty_like(g)
        req = dist.isend(g.contiguous(), ctx.prv, group=ctx.group)
        dist.recv(back, ctx.nxt, group=ctx.group)
        req.wait()
        return back, None


def against_gloo(group):
    """Forward values and gradients equal those of the same computation through gloo."""
    import torch.distributed.nn.functional as DF

    n, me = dist.get_world_size(group), dist.get_rank(group)
    gen = torch.Generator().manual_seed(99 + me)

    def rand(*shape):
        return torch.randn(shape, dtype=torch.float64, generator=gen)

    src_global = global_rank(group, n - 1)
    pairs = {
        # name: (symm, gloo reference, input shape)
        "all_gather": (lambda x: F.all_gather(x, group), lambda x: RefAllGather.apply(x, group), (3, 2)),
        "reduce_scatter sum": (
            lambda x: F.reduce_scatter(x, "sum", group),
            lambda x: DF.reduce_scatter(torch.empty(2, 2, dtype=x.dtype), list(x.chunk(n)), group=group),
            (2 * n, 2),
        ),
        "reduce_scatter avg": (
            lambda x: F.reduce_scatter(x, "avg", group),
            lambda x: RefReduceScatterAvg.apply(x, group),
            (2 * n, 2),
        ),
        "all_reduce identity": (
            lambda x: F.all_reduce(x, "sum", group),
            lambda x: RefAllReduceIdentity.apply(x, dist.ReduceOp.SUM, group),
            (5,),
        ),
        "all_reduce avg identity": (
            lambda x: F.all_reduce(x, "avg", group),
            lambda x: RefAllReduceIdentity.apply(x, dist.ReduceOp.AVG, group),
            (5,),
        ),
        "all_reduce all_reduce": (
            lambda x: F.all_reduce(x, "sum", group, backward="all_reduce"),
            lambda x: DF.all_reduce(x, group=group),
            (5,),
        ),
        "all_to_all": (
            lambda x: F.all_to_all(x, [1 + (j + me) % n for j in range(n)], splits_from(me, n), group),
            lambda x: DF.all_to_all_single(
                torch.empty(n * (n + 1) // 2, 3, dtype=x.dtype),
                x,
                [1 + (j + me) % n for j in range(n)],
                splits_from(me, n),
                group=group,
            ),
            (n * (n + 1) // 2, 3),
        ),
        "broadcast": (lambda x: F.broadcast(x, n - 1, group), lambda x: DF.broadcast(x, src_global, group=group), (4,)),
        "send/recv ring": (
            lambda x: F.send(x, (me + 1) % n, group) * 0 + F.recv(x, (me - 1) % n, group=group),
            lambda x: RefRing.apply(x, group),
            (4,),
        ),
        "sendrecv ring": (
            lambda x: F.sendrecv(x, (me + 1) % n, (me - 1) % n, group=group),
            lambda x: RefRing.apply(x, group),
            (4,),
        ),
    }
    for name, (mine, ref, shape) in pairs.items():
        x0 = rand(*shape)
        outs, grads = [], []
        upstream = None
        for fn in (mine, ref):
            x = x0.clone().requires_grad_()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch.distributed.nn's deprecation notes
                y = fn(x)
                if upstream is None:
                    upstream = rand(*y.shape)
                y.backward(upstream)
            outs.append(y.detach())
            grads.append(x.grad)
        assert outs[0].shape == outs[1].shape, (name, outs[0].shape, outs[1].shape)
        assert torch.allclose(outs[0], outs[1], rtol=1e-12, atol=1e-12), (name, outs)
        assert torch.allclose(grads[0], grads[1], rtol=1e-12, atol=1e-12), (name, grads)


def pipeline(rank, world):
    """Two pipeline stages on ranks 0 and 1: stage 0 sends its activations, stage 1 computes
    the loss; stage 0's weight gradient (through the gradient stage 1 sends back) equals the
    single-process one. A tensor sent without grad arrives without grad."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(4, 3, dtype=torch.float64, generator=gen)
    w0 = torch.randn(3, 5, dtype=torch.float64, generator=gen)
    w1 = torch.randn(5, 2, dtype=torch.float64, generator=gen)
    a, b = w0.clone().requires_grad_(), w1.clone().requires_grad_()
    (torch.tanh(x @ a) @ b).pow(2).sum().backward()  # the reference, in one process
    if rank == 0:
        w = w0.clone().requires_grad_()
        y = F.send(torch.tanh(x @ w), 1)
        (0 * y.sum()).backward()  # reaches send's backward, which receives the gradient
        assert torch.allclose(w.grad, a.grad, rtol=1e-12, atol=1e-12), (w.grad, a.grad)
        F.send(torch.ones(3), 1)  # no grad: the receiver's tensor will not require grad
    elif rank == 1:
        w = w1.clone().requires_grad_()
        h = F.recv((4, 5), 0, torch.float64)
        assert h.requires_grad
        (h @ w).pow(2).sum().backward()  # sends h's gradient to rank 0
        assert torch.allclose(w.grad, b.grad, rtol=1e-12, atol=1e-12)
        plain = F.recv(torch.empty(3), 0)
        assert not plain.requires_grad and plain.tolist() == [1.0] * 3
    dist.barrier()


def autograd(rank, world):
    groups = [None, symm.create_group(list(reversed(range(world))))]
    for g in groups:
        gradchecks(g)
        explicit_all_reduce_conventions(g)
        against_gloo(g)
    # The differentiable forms check their own arguments; a bad op fails on every rank at once.
    from scenarios import expect

    x = torch.ones(4, requires_grad=True)
    expect(symm.InvalidArgument, lambda: F.all_reduce(x, "max"), "op = 'max'", "sum", rank=rank)
    expect(symm.InvalidArgument, lambda: F.reduce_scatter(torch.ones(world + 1), "sum"), "input", "dim 0", rank=rank)
    expect(symm.InvalidArgument, lambda: F.all_reduce(x, backward="twice"), "backward = 'twice'", rank=rank)
    expect(symm.InvalidArgument, lambda: F.all_to_all(torch.ones(world), None, [1] * (world + 1)), "input_split_sizes")
    expect(symm.InvalidArgument, lambda: F.broadcast(x, world), f"src = {world}", rank=rank)
    t = torch.ones(2)
    symm.shmem_allreduce(t)
    assert t.tolist() == [float(world)] * 2
    # send/recv between two ranks of the world (whose workspace the collectives above made)
    pipeline(rank, world)
    for g in groups:
        sendrecv_mixed_grad(g)


def sendrecv_mixed_grad(group):
    """A sendrecv ring where only group rank 0's input requires grad: rank 1's result requires
    grad (its backward sends the gradient to rank 0 and waits for nothing), ranks 2.. have
    nothing to differentiate, rank 0's backward only receives. The gradient is exact, and no
    message is left behind (a plain exchange afterwards gets exactly what was sent)."""
    n, me = dist.get_world_size(group), dist.get_rank(group)
    nxt, prv = (me + 1) % n, (me - 1) % n
    x = torch.arange(3, dtype=torch.float64) + 10 * me
    x.requires_grad_(me == 0)
    y = F.sendrecv(x, nxt, prv, group=group)
    assert torch.equal(y.detach(), torch.arange(3, dtype=torch.float64) + 10 * prv), y
    assert y.requires_grad == (me == 0 or prv == 0), (me, y.requires_grad)
    if y.requires_grad:
        (y * (me + 1)).sum().backward()  # loss_me = (me + 1) * sum(x_prv)
    if me == 0:
        # x goes to rank 1, whose loss weighs it by 2
        assert torch.equal(x.grad, torch.full((3,), 2.0, dtype=torch.float64)), x.grad
    # Under no_grad nothing waits for a gradient.
    with torch.no_grad():
        z = F.sendrecv(torch.ones(2, requires_grad=True), nxt, prv, group=group)
    assert not z.requires_grad
    mine, got = torch.full((5,), float(me)), torch.empty(5)
    symm.shmem_sendrecv(mine, nxt, got, prv, group)
    assert torch.equal(got, torch.full((5,), float(prv))), ("a message was left behind", got)


# --------------------------------------------------------------------------------------------
# training on a 2 x 2 mesh: symm in the data-parallel groups, gloo in the tensor-parallel ones
# --------------------------------------------------------------------------------------------


class GlooGatherColumns(torch.autograd.Function):
    """The tensor-parallel activations, gathered with all_gather_into_tensor (gloo) and laid
    side by side; backward: this rank's columns (what follows is replicated in the group)."""

    @staticmethod
    def forward(ctx, h, group):
        n, me = dist.get_world_size(group), dist.get_rank(group)
        ctx.me, ctx.cols = me, h.shape[1]
        out = torch.empty((n * h.shape[0], h.shape[1]), dtype=h.dtype)
        dist.all_gather_into_tensor(out, h.contiguous(), group=group)
        return out.view(n, h.shape[0], h.shape[1]).permute(1, 0, 2).reshape(h.shape[0], n * h.shape[1])

    @staticmethod
    def backward(ctx, g):
        return g[:, ctx.me * ctx.cols : (ctx.me + 1) * ctx.cols].contiguous(), None


def train(mode, dp, tp, steps=6):
    """A 2-layer MLP, the first layer split by rows across ``tp``; returns the parameters and
    the losses. ``mode``: "symm" averages gradients with symm.shmem_allreduce in ``dp`` (a
    bucket in symmetric memory) while gloo gathers activations in ``tp``; "gloo" does both
    with gloo."""
    d_in, hidden, d_out, batch = 8, 16, 4, 6
    n_tp, tp_rank = dist.get_world_size(tp), dist.get_rank(tp)
    dp_rank = dist.get_rank(dp)
    gen = torch.Generator().manual_seed(7)  # the same full model on every rank
    w1 = torch.randn(hidden, d_in, generator=gen) * 0.3
    b1 = torch.randn(hidden, generator=gen) * 0.1
    w2 = torch.randn(d_out, hidden, generator=gen) * 0.3
    b2 = torch.randn(d_out, generator=gen) * 0.1
    rows = slice(tp_rank * hidden // n_tp, (tp_rank + 1) * hidden // n_tp)
    params = [w1[rows].clone(), b1[rows].clone(), w2.clone(), b2.clone()]
    for p in params:
        p.requires_grad_()
    total = sum(p.numel() for p in params)
    bucket = symm.empty(total, torch.float32, group=dp) if mode == "symm" else torch.empty(total)
    losses = []
    data = torch.Generator().manual_seed(1000 + dp_rank)  # one batch per dp replica
    x = torch.randn(batch, d_in, generator=data)
    target = torch.randn(batch, d_out, generator=data)
    for _ in range(steps):
        h = torch.relu(x @ params[0].t() + params[1])
        h = GlooGatherColumns.apply(h, tp)
        out = h @ params[2].t() + params[3]
        loss = ((out - target) ** 2).mean()
        loss.backward()
        # gloo work in flight in the tp group while the dp gradients are averaged: different
        # tensors, different groups
        logged = loss.detach().reshape(1).clone()
        work = dist.all_reduce(logged, group=tp, async_op=True)
        at = 0
        for p in params:
            bucket[at : at + p.numel()] = p.grad.flatten()
            at += p.numel()
        if mode == "symm":
            symm.shmem_allreduce(bucket, "avg", group=dp)
        else:
            dist.all_reduce(bucket, op=dist.ReduceOp.AVG, group=dp)
        work.wait()
        losses.append(logged.item() / n_tp)
        at = 0
        with torch.no_grad():
            for p in params:
                p -= 0.1 * bucket[at : at + p.numel()].view_as(p)
                at += p.numel()
                p.grad = None
    result = [p.detach().clone() for p in params]
    if mode == "symm":
        symm.free(bucket)
    return result, losses


def interop_mesh(rank, world):
    assert world == 4
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp, tp = mesh.get_group("dp"), mesh.get_group("tp")
    assert dist.get_process_group_ranks(dp) == [rank % 2, rank % 2 + 2]
    assert dist.get_process_group_ranks(tp) == [rank // 2 * 2, rank // 2 * 2 + 1]
    p_symm, l_symm = train("symm", dp, tp)
    p_gloo, l_gloo = train("gloo", dp, tp)
    worst = max((a - b).abs().max().item() for a, b in zip(p_symm, p_gloo))
    exact = all(torch.equal(a, b) for a, b in zip(p_symm, p_gloo))
    print(f"rank {rank}: max |symm - gloo| over the parameters = {worst:.3g}, bit-identical: {exact}", flush=True)
    assert worst <= 1e-6, worst
    assert l_symm == l_gloo or max(abs(a - b) for a, b in zip(l_symm, l_gloo)) <= 1e-6, (l_symm, l_gloo)
    assert l_symm[-1] < l_symm[0], l_symm
    # the replicated parameters are the same on every rank of both runs' dp and tp groups
    w2 = p_symm[2].reshape(-1)
    everyone = [torch.empty_like(w2) for _ in range(world)]
    dist.all_gather(everyone, w2)
    assert all(torch.equal(e, w2) for e in everyone)
    dist.barrier()


# --------------------------------------------------------------------------------------------
# the RFC's own calls (symm.shmem_*) with tensors that require grad: recorded by symm.autograd
# --------------------------------------------------------------------------------------------


def _f64(*shape):
    return torch.empty(shape, dtype=torch.float64)


def _needs_grad(*shape):
    """A receive buffer that requires grad and is not a leaf (autograd refuses to write a leaf
    that requires grad in place)."""
    return torch.zeros(shape, dtype=torch.float64, requires_grad=True).clone()


def rfc_gradchecks(group):
    """gradcheck through each symm.shmem_* call itself (in place, into fresh or derived tensors),
    with the same global function as ``gradchecks``: every rank's output is a separate term
    (the sum-over-ranks convention, Gather), so allreduce's backward is an allreduce."""
    n = dist.get_world_size(group)
    me = dist.get_rank(group)
    nxt, prv = (me + 1) % n, (me - 1) % n
    sc = lambda X: Scatter.apply(X, group)  # noqa: E731
    ga = lambda y: Gather.apply(y, group)  # noqa: E731

    def allgather(x):
        out = _f64(n * x.shape[0], *x.shape[1:])
        assert symm.shmem_allgather(out, x, group) is None and out.grad_fn is not None
        return out

    def reduce_scatter(op):
        def f(x):
            out = _f64(x.shape[0] // n, *x.shape[1:])
            symm.shmem_reduce_scatter(out, x, op, group)
            return out

        return f

    def allreduce(op):
        def f(x):
            y = x.clone()
            symm.shmem_allreduce(y, op, group)
            return y

        return f

    def alltoall(x):
        # uneven parts, counts in elements; two elements past sum(counts) are left as they were
        # (and carry their own gradient through)
        rows = splits_from(me, n)
        row = x.shape[1]
        counts = [row * (1 + (j + me) % n) for j in range(n)]
        recv = torch.cat([_f64(sum(counts)).zero_(), 3 * x[0, :2]])
        symm.shmem_alltoall(list(torch.split(x, rows)), recv, counts, group)
        return recv

    def alltoall_tensor_counts(x):
        recv = _f64(x.numel())
        counts = torch.full((n, 1), x.numel() // n, dtype=torch.int64)  # HyperParallel's form
        symm.shmem_alltoall([p.reshape(-1) for p in x.chunk(n)], recv, counts, group)
        return recv

    def broadcast(x):
        y = x.clone()
        symm.shmem_broadcast(y, n - 1, group)
        return y

    def send_recv(x):
        y = symm.shmem_send(x, nxt, group)  # the alias autograd reaches the send's backward by
        # gradcheck differentiates with torch.autograd.grad(out, X), which runs only the nodes
        # on paths to X: the receive buffer hangs off X's graph (loss.backward() runs all)
        z = 0 * x
        symm.shmem_recv(z, prv, group)
        return torch.cat([2 * y, z**2])

    def sendrecv(x):
        z = _f64(*x.shape)
        symm.shmem_sendrecv(x, nxt, z, prv, group)
        return z.tanh()

    def sendrecv_other_shape(x):
        # 6 elements sent the other way round, received as 2 x 3
        z = _f64(2, 3)
        symm.shmem_sendrecv(x.repeat(2), prv, z, nxt, group)
        return z.flatten() ** 2

    checks = {
        "shmem_allgather": (allgather, (2, 3)),
        "shmem_reduce_scatter sum": (reduce_scatter("sum"), (2 * n, 2)),
        "shmem_reduce_scatter avg": (reduce_scatter("avg"), (n, 3)),
        "shmem_allreduce sum": (allreduce("sum"), (3, 2)),
        "shmem_allreduce avg": (allreduce(1), (4,)),
        "shmem_alltoall": (alltoall, (n * (n + 1) // 2, 2)),
        "shmem_alltoall, counts an (n, 1) tensor": (alltoall_tensor_counts, (n, 2)),
        "shmem_broadcast": (broadcast, (3,)),
        "shmem_send/shmem_recv": (send_recv, (3,)),
        "shmem_sendrecv": (sendrecv, (3,)),
        "shmem_sendrecv, other shape": (sendrecv_other_shape, (3,)),
    }
    # shmem_allreduce has the replicated convention (identity backward): its output is one
    # value, the same on every rank, and so is what follows it (no Gather), as for
    # symm.functional.all_reduce's default.
    replicated = ("shmem_allreduce sum", "shmem_allreduce avg")
    for seed, (name, (fn, shape)) in enumerate(checks.items()):
        if name in replicated:
            gradcheck(name, lambda X, fn=fn: fn(sc(X)), global_input(n, *shape, seed=seed))
        else:
            gradcheck(name, lambda X, fn=fn: ga(fn(sc(X))), global_input(n, *shape, seed=seed))


def rfc_calls_by_hand(group):
    """What the recorded calls do, checked by hand: the grad_fn and version of the tensor
    written, the gradient a loss gets, the async form; nothing recorded without grad."""
    n, me = dist.get_world_size(group), dist.get_rank(group)
    x = torch.arange(4, dtype=torch.float64).requires_grad_()
    w = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=torch.float64) * (me + 1)
    # allreduce, the RFC's identity backward (the result and its gradient are replicated):
    # L = <w, y>, y = sum_r x_r: dL/dx = w, this rank's own
    y = x * 1
    v = y._version
    assert symm.shmem_allreduce(y, group=group) is None
    assert type(y.grad_fn).__name__ == "ShmemAllReduceBackward" and y._version > v, (y.grad_fn, y._version)
    assert torch.equal(y.detach(), n * torch.arange(4, dtype=torch.float64))
    (y * w).sum().backward()
    assert torch.equal(x.grad, w), (x.grad, w)
    # allgather into a plain tensor: loss.backward() reaches x (reduce_scatter of the gradient)
    x.grad = None
    out = torch.empty(4 * n, dtype=torch.float64)
    symm.shmem_allgather(out, x * 2, group)
    assert out.requires_grad and not out.is_leaf
    (out * torch.arange(4 * n, dtype=torch.float64)).sum().backward()
    want = n * 2 * torch.arange(4 * me, 4 * me + 4, dtype=torch.float64)
    assert torch.equal(x.grad, want), (x.grad, want)
    # in place: allgather's input is this rank's part of its output, reduce_scatter's output
    # this rank's part of its input; the gradients are those of the out-of-place calls
    c = torch.arange(4 * n, dtype=torch.float64) - 3
    grads = []
    for in_place in (False, True):
        x.grad = None
        buf = (x * 2).repeat(n)
        part = buf[4 * me : 4 * me + 4]
        if in_place:
            symm.shmem_allgather(buf, part, group)
        else:
            buf = torch.empty(4 * n, dtype=torch.float64)
            symm.shmem_allgather(buf, x * 2, group)
        inp = buf * c
        rs = inp[4 * me : 4 * me + 4] if in_place else torch.empty(4, dtype=torch.float64)
        symm.shmem_reduce_scatter(rs, inp, "sum", group)
        (rs * c[:4]).sum().backward()
        grads.append(x.grad.clone())
    assert torch.equal(grads[0], grads[1]), grads
    # the async form records too, and returns its work
    x.grad = None
    y = x * 1
    work = symm.shmem_allreduce(y, "avg", group, async_op=True)
    assert isinstance(work, symm.Work) and y.grad_fn is not None
    work.wait()
    assert torch.allclose(y.detach(), torch.arange(4, dtype=torch.float64))
    y.sum().backward()
    want = torch.full((4,), 1.0 / n, dtype=torch.float64)  # avg: identity divided by the group's size
    assert torch.equal(x.grad, want), x.grad
    # nothing requires grad, or grad mode off: nothing recorded, the call as before
    t = torch.ones(3)
    assert symm.shmem_allreduce(t, group=group) is None and t.grad_fn is None and not t.requires_grad
    with torch.no_grad():
        g = x * 1
        symm.shmem_allreduce(g, group=group)
    assert g.grad_fn is None
    h = x * 1
    with torch.no_grad():
        symm.shmem_allreduce(h, group=group)  # in place under no_grad: torch's rule, h keeps its grad_fn
    assert type(h.grad_fn).__name__ == "MulBackward0"
    # a view of a symmetric tensor (views carry autograd metadata) takes the call as before
    buf = symm.empty(4, torch.float32, group=group)
    buf.fill_(1.0)
    symm.shmem_allreduce(buf[1:3], group=group)
    assert buf.tolist() == [1.0, float(n), float(n), 1.0] and not buf.requires_grad
    symm.free(buf)


def rfc_call_errors(rank, group):
    """A parameter (a leaf that requires grad) written by a call that has nothing else to record
    is written unrecorded, as torch.distributed's collectives write it; refusals happen before
    anything moves: the round is rejected, so a peer making the same call without grad fails at
    once (PeerRejected), and the group stays usable."""
    from scenarios import expect

    me, n = dist.get_rank(group), dist.get_world_size(group)
    param = torch.nn.Parameter(torch.full((3,), float(me + 1)))
    assert symm.shmem_allreduce(param, group=group) is None and param.is_leaf and param.grad_fn is None
    assert param.tolist() == [n * (n + 1) / 2] * 3
    symm.shmem_broadcast(param, n - 1, group)
    assert param.is_leaf and param.tolist() == [n * (n + 1) / 2] * 3
    plain = torch.ones(3)
    # a leaf written while another tensor of the call requires grad: refused
    out = torch.zeros(3 * n, requires_grad=True)
    x = torch.ones(3, requires_grad=True) * 1
    if me == 0:
        expect(symm.InvalidArgument, lambda: symm.shmem_allgather(out, x, group), "output_tensor", "leaf", rank=rank)
    else:
        expect(symm.PeerRejected, lambda: symm.shmem_allgather(torch.empty(3 * n), plain, group))
    # max and min have no gradient
    if me == 0:
        expect(symm.InvalidArgument, lambda: symm.shmem_allreduce(x, "max", group), "op = 'max'", "grad", rank=rank)
    else:
        expect(symm.PeerRejected, lambda: symm.shmem_allreduce(plain, "max", group))
    # a send that records its backward returns the alias: it is blocking only
    expect(symm.InvalidArgument, lambda: symm.shmem_send(x, 0, group, async_op=True), "async_op", rank=rank)
    got = torch.empty(3 * n)
    symm.shmem_allgather(got, x, group)  # the group is still in step
    assert got.grad_fn is not None and torch.equal(got.detach(), torch.ones(3 * n))
    assert plain.tolist() == [1.0] * 3


def rfc_calls(rank, world):
    groups = [None, symm.create_group(list(reversed(range(world))))]
    for g in groups:
        rfc_gradchecks(g)
        rfc_calls_by_hand(g)
    rfc_call_errors(rank, None)
    rfc_pipeline(rank, world)


def rfc_pipeline(rank, world):
    """The pipeline of ``pipeline`` with the RFC calls: stage 0's shmem_send returns the alias
    through which its backward is reached; stage 1 receives into a buffer that requires grad."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(4, 3, dtype=torch.float64, generator=gen)
    w0 = torch.randn(3, 5, dtype=torch.float64, generator=gen)
    w1 = torch.randn(5, 2, dtype=torch.float64, generator=gen)
    a, b = w0.clone().requires_grad_(), w1.clone().requires_grad_()
    (torch.tanh(x @ a) @ b).pow(2).sum().backward()
    if rank == 0:
        w = w0.clone().requires_grad_()
        h = torch.tanh(x @ w)  # tanh saves its output: the send must not modify h's version
        y = symm.shmem_send(h, 1)
        assert y is not None and y.grad_fn is not None and torch.equal(y, h)
        (0 * y.sum()).backward()  # reaches the send's backward, which receives the gradient
        assert torch.allclose(w.grad, a.grad, rtol=1e-12, atol=1e-12), (w.grad, a.grad)
        assert symm.shmem_send(torch.ones(3), 1) is None  # no grad: the call as before
    elif rank == 1:
        w = w1.clone().requires_grad_()
        h = _needs_grad(4, 5)
        symm.shmem_recv(h, 0)
        (h @ w).pow(2).sum().backward()  # sends h's gradient to rank 0
        assert torch.allclose(w.grad, b.grad, rtol=1e-12, atol=1e-12)
        plain = torch.empty(3)
        symm.shmem_recv(plain, 0)
        assert not plain.requires_grad and plain.tolist() == [1.0] * 3
    dist.barrier()
