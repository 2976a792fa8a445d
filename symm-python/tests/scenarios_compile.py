"""torch.compile over symm's collectives (run by worker.py as ``scenarios_compile.<name>``):
symm.functional's collectives and the RFC's own calls (symm.shmem_*) compile with no graph break
and give the eager values and gradients with every backend (a backend that records the graphs,
"aot_eager", and Inductor), and torch.library.opcheck passes on every operator of
``torch.ops.symm`` (each check runs the operator several times: collectively, on every rank).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import symm
import symm.functional as F
import symm.library as L


def close(a, b):
    return torch.allclose(a, b, rtol=1e-12, atol=1e-12)


class Recorder:
    """A backend that keeps Dynamo's graphs and what AOTAutograd makes of them (forward and
    backward, functionalized), and runs the forward graph as it is."""

    def __init__(self):
        self.dynamo, self.aot = [], []

    def __call__(self, gm, example_inputs):
        from torch._dynamo.backends.common import aot_autograd

        self.dynamo.append(gm)

        def keep(g, _):
            self.aot.append(g)
            return g.forward

        return aot_autograd(fw_compiler=keep, bw_compiler=keep)(gm, example_inputs)

    @staticmethod
    def targets(graphs):
        """What each call in the graphs calls; a higher-order operator with the operator it
        wraps (``auto_functionalized_v2(symm.shmem_allreduce.default)``)."""
        out = []
        for g in graphs:
            for n in g.graph.nodes:
                if n.op == "call_function":
                    wrapped = [a for a in n.args if isinstance(a, torch._ops.OpOverload)]
                    out.append(str(n.target) + "".join(f"({w})" for w in wrapped[:1]))
        return out


class TensorParallelBlock(torch.nn.Module):
    """A block with every functional collective: the first layer's rows split across the ranks
    (all_reduce of the partial products, the replicated convention), all_gather / reduce_scatter
    of the activations, an all_to_all of rows and a broadcast."""

    def __init__(self, n):
        super().__init__()
        gen = torch.Generator().manual_seed(3)
        self.n = n
        self.w1 = torch.nn.Parameter(torch.randn(4, 6, dtype=torch.float64, generator=gen))
        self.w2 = torch.nn.Parameter(torch.randn(6, 4, dtype=torch.float64, generator=gen))

    def forward(self, x):
        h = F.all_reduce(x @ self.w1)  # (2n, 6), replicated
        g = F.all_gather(torch.tanh(h))  # (2n * n, 6)
        r = F.reduce_scatter(g @ self.w2, "avg")  # (2n, 4)
        a = F.all_to_all(r, [2] * self.n, [2] * self.n)
        b = F.broadcast(a * 0.5, 0)
        s = F.all_reduce(b.sin(), "sum", backward="all_reduce")
        return (s**2).sum()


def compile_functional(rank, world):
    """A model calling symm.functional's collectives, compiled with fullgraph=True: one graph,
    symm's operators in it, the eager loss and gradients, with each backend."""
    n = world
    gen = torch.Generator().manual_seed(10 + rank)
    x = torch.randn(2 * n, 4, dtype=torch.float64, generator=gen)
    model = TensorParallelBlock(n)

    def run(m):
        m.zero_grad()
        loss = m(x)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in m.parameters()]

    want, want_grads = run(model)
    explained = torch._dynamo.explain(model)(x)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons
    rec = Recorder()
    backends = [("recorded", rec), ("aot_eager", "aot_eager"), ("inductor", "inductor")]
    for name, backend in backends:
        torch._dynamo.reset()
        loss, grads = run(torch.compile(model, backend=backend, fullgraph=True))
        assert close(loss, want), (name, loss, want)
        assert all(close(a, b) for a, b in zip(grads, want_grads)), (name, grads, want_grads)
    ops = Recorder.targets(rec.dynamo)
    for op in ("symm.all_reduce", "symm.all_gather", "symm.reduce_scatter", "symm.all_to_all", "symm.broadcast"):
        assert op in ops, (op, ops)
    # the backward graph runs the duals: reduce_scatter(sum) for all_gather, all_gather for
    # reduce_scatter, all_to_all with swapped splits, reduce (to the root) for broadcast
    backward = Recorder.targets(rec.aot[1:])
    for op in ("symm.reduce_scatter.default", "symm.all_gather.default", "symm.all_to_all.default"):
        assert op in backward, (op, backward)
    assert "symm.reduce.default" in backward and "symm.all_reduce.default" in backward, backward
    print(f"rank {rank}: functional collectives compiled in one graph, 3 backends", flush=True)


def rfc_step(x, n, me):
    """The RFC's calls, in place, into fresh and derived tensors (what a compiled step does)."""
    y = x * 2
    symm.shmem_allreduce(y)
    g = torch.empty(n * x.numel(), dtype=x.dtype)
    symm.shmem_allgather(g, y)
    r = torch.empty(x.numel(), dtype=x.dtype)
    symm.shmem_reduce_scatter(r, g * 3, "avg")
    b = r.clone()
    symm.shmem_broadcast(b, n - 1)
    got = torch.zeros(n * x.numel() + 1, dtype=x.dtype)  # the last element is left as it is
    symm.shmem_alltoall(list(g.view(n, -1)), got, [x.numel()] * n)
    return torch.stack([y.sum(), g.sum(), r.sum(), b.sum(), got.tanh().sum()])


def rfc_messages(x, n, me):
    nxt, prv = (me + 1) % n, (me - 1) % n
    z = torch.empty_like(x)
    symm.shmem_sendrecv(x * 3, nxt, z, prv)
    if me == 0:
        symm.shmem_send(z + 1, 1)
        return z
    if me == 1:
        w = torch.empty_like(x)
        symm.shmem_recv(w, 0)
        return z + w
    return z


def compile_rfc_calls(rank, world):
    """symm.shmem_* inside compiled functions: with nothing requiring grad, one graph of symm's
    in-place operators (functionalized by AOTAutograd); with grad, the collectives record their
    backward in the graph (their functional operators) and give the eager gradient; a message
    whose tensor requires grad, or an async_op call, runs outside the graph (a graph break)."""
    n, me = world, rank
    x = torch.arange(3, dtype=torch.float64) + 10 * me
    want, want_msg = rfc_step(x, n, me), rfc_messages(x, n, me)
    for fn in (rfc_step, rfc_messages):
        explained = torch._dynamo.explain(fn)(x, n, me)
        assert explained.graph_count == 1 and explained.graph_break_count == 0, (fn, explained.break_reasons)
    rec = Recorder()
    for name, backend in [("recorded", rec), ("aot_eager", "aot_eager"), ("inductor", "inductor")]:
        torch._dynamo.reset()
        with torch.no_grad():
            got = torch.compile(rfc_step, backend=backend, fullgraph=True)(x, n, me)
            got_msg = torch.compile(rfc_messages, backend=backend, fullgraph=True)(x, n, me)
        assert close(got, want) and close(got_msg, want_msg), (name, got, want, got_msg, want_msg)
    ops = Recorder.targets(rec.dynamo)
    message = {0: ["send"], 1: ["recv"]}.get(me, [])
    for op in ["allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall", "sendrecv"] + message:
        assert f"symm.shmem_{op}" in ops, (op, ops)
    functionalized = " ".join(Recorder.targets(rec.aot))
    assert "auto_functionalized_v2(symm.shmem_allreduce.default)" in functionalized, functionalized
    if me == 0:
        assert "with_effects(symm.shmem_send.default)" in functionalized, functionalized  # kept, in order

    # with grad: the same gradients as eager (where the calls record through symm.autograd)
    xg = x.clone().requires_grad_()
    weights = torch.tensor([1.0, -2.0, 0.5, 3.0, 1.5], dtype=torch.float64)
    (rfc_step(xg, n, me) * weights).sum().backward()
    want_grad = xg.grad.clone()
    for backend in ("aot_eager", "inductor"):
        torch._dynamo.reset()
        xg.grad = None
        (torch.compile(rfc_step, backend=backend, fullgraph=True)(xg, n, me) * weights).sum().backward()
        assert close(xg.grad, want_grad), (backend, xg.grad, want_grad)

    # a message that records its backward, and an async_op call, break the graph, then run as in
    # eager mode
    def ring(t):
        z = torch.empty_like(t)
        symm.shmem_sendrecv(t * 2, (me + 1) % n, z, (me - 1) % n)
        return (z * t).sum()

    def asynchronous(t):
        y = t * 2
        work = symm.shmem_allreduce(y, async_op=True)
        work.wait()
        return y + 1

    for fn, breaks in [(ring, 1), (asynchronous, 1)]:
        torch._dynamo.reset()
        explained = torch._dynamo.explain(fn)(xg)
        assert explained.graph_break_count == breaks, (fn, explained.break_reasons)
        assert "symm" in str(explained.break_reasons[0].reason), explained.break_reasons
    xg.grad = None
    ring(xg).backward()
    want_grad = xg.grad.clone()
    torch._dynamo.reset()
    xg.grad = None
    torch.compile(ring, backend="aot_eager")(xg).backward()
    assert close(xg.grad, want_grad), (xg.grad, want_grad)
    with torch.no_grad():
        assert close(torch.compile(asynchronous, backend="aot_eager")(x), asynchronous(x))
    print(f"rank {rank}: symm.shmem_* compiled", flush=True)


def compile_with_a_group(rank, world):
    """A group travels into the graph as its name: a group whose ranks run the other way round."""
    group = symm.create_group(list(reversed(range(world))))

    def f(x):
        y = F.all_gather(x * 2, group)
        z = torch.empty(x.numel(), dtype=x.dtype)
        symm.shmem_reduce_scatter(z, y.reshape(-1), "sum", group)
        return F.broadcast(z, 0, group).sum() + (y * torch.arange(y.shape[0], dtype=x.dtype)).sum()

    x = torch.arange(2, dtype=torch.float64) + rank
    torch._dynamo.reset()
    assert close(torch.compile(f, backend="aot_eager", fullgraph=True)(x), f(x))


def opchecks(rank, world):
    """torch.library.opcheck on every operator of the symm namespace (schema, autograd
    registration, fake kernel, AOT dispatch with dynamic shapes), collectively."""
    n, me = world, rank
    nxt, prv = (me + 1) % n, (me - 1) % n
    symm.init()
    g = L.group_name(None)
    gen = torch.Generator().manual_seed(20 + rank)

    def t(*shape, grad=False):
        return torch.randn(shape, dtype=torch.float64, generator=gen).requires_grad_(grad)

    ops = torch.ops.symm
    cases = [
        (ops.all_gather, (t(2, 3, grad=True), g)),
        (ops.reduce_scatter, (t(2 * n, 3, grad=True), "sum", g, None)),
        (ops.reduce_scatter, (t(n, 2, grad=True), "avg", g, None)),
        (ops.all_reduce, (t(3, grad=True), "sum", g, "identity", None)),
        (ops.all_reduce, (t(3, grad=True), "avg", g, "all_reduce", None)),
        (
            ops.all_to_all,
            (
                t(n * (n + 1) // 2, 2, grad=True),
                [1 + (j + me) % n for j in range(n)],
                [1 + (me + i) % n for i in range(n)],
                g,
            ),
        ),
        (ops.broadcast, (t(4, grad=True), 0, g)),
        (ops.reduce, (t(4, grad=True), n - 1, g)),
        (ops.shmem_allreduce, (t(3), "sum", g, None)),
        (ops.shmem_reduce_scatter, (t(2), t(2 * n), "max", g, None)),
        (ops.shmem_allgather, (t(2 * n), t(2), g)),
        (ops.shmem_alltoall, ([t(2) for _ in range(n)], t(2 * n), [2] * n, g)),
        (ops.shmem_broadcast, (t(3), 0, g)),
        (ops.shmem_sendrecv, (t(3), nxt, t(3), prv, g)),
    ]
    # send and recv pair up: rank 0 checks the send to 1 while rank 1 checks the receive
    if me == 0:
        cases.append((ops.shmem_send, (t(3), 1, g)))
    elif me == 1:
        cases.append((ops.shmem_recv, (t(3), 0, g)))
    for op, args in cases:
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, (op, result)
    # every message was taken: a plain exchange gets exactly what was sent
    mine, got = torch.full((4,), float(me)), torch.empty(4)
    symm.shmem_sendrecv(mine, nxt, got, prv)
    assert torch.equal(got, torch.full((4,), float(prv))), ("a message was left behind", got)
    print(f"rank {rank}: opcheck passed on {len(cases)} operators", flush=True)


def compiled(rank, world):
    compile_functional(rank, world)
    compile_rfc_calls(rank, world)
    compile_with_a_group(rank, world)
    opchecks(rank, world)
    dist.barrier()
