"""MC2 fused operators (symm.mc2) on real ranks: HyperParallel's API and PyTorch's."""

import torch
import torch.distributed as dist

import symm
import symm.mc2 as mc2
from scenarios import expect


def _gathered(x, group):
    """The group's ``x`` concatenated along dim 0, by Gloo (the unfused reference)."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts)


def _hp_forms(rank, group, tag):
    """HyperParallel's forms against the unfused computation, called three times with the same
    output tensors and new data (the calls must not read what an earlier call left)."""
    world = dist.get_world_size(group)
    me = dist.get_group_rank(group, rank) if group is not None else rank
    m, k, n = 12, 8, 6
    c = torch.empty(world * m, n)
    gather_out = torch.empty(world * m, k)
    signal = torch.zeros(world * 4, dtype=torch.int32)
    for call in range(3):
        a = torch.randn(m, k, generator=torch.Generator().manual_seed(10 * call + me))
        b = torch.randn(k, n, generator=torch.Generator().manual_seed(call))
        for block_size in (None, 5, m):
            g, out = symm.mc2.fused_all_gather_matmul(a, b, c, gather_out, signal, block_size, group=group)
            assert g is gather_out and out is c
            want = _gathered(a, group)
            assert torch.equal(gather_out, want), f"{tag}: gather_out, call {call}"
            assert torch.allclose(c, want @ b, atol=1e-5), f"{tag}: c, call {call} block {block_size}"
        x1 = torch.randn(world * m, k, generator=torch.Generator().manual_seed(100 * call + me))
        for op in ("sum", "avg"):
            for block_size in (None, 5):
                got = symm.mc2.fused_matmul_reduce_scatter(x1, b, None, signal, op, block_size, group=group)
                total = sum(torch.tensor_split(_gathered((x1 @ b).unsqueeze(0), group), world))[0]
                want = (total / world if op == "avg" else total)[me * m : (me + 1) * m]
                assert torch.allclose(got, want, atol=1e-4), f"{tag}: matmul + reduce_scatter {op}, call {call}"
    assert torch.equal(signal, torch.zeros_like(signal)), "signal is not written"


def hyperparallel_api(rank, world):
    _hp_forms(rank, None, "world")
    # A sub-group: the first two ranks (the others pass).
    sub = symm.create_group([1, 0])
    if rank in (0, 1):
        _hp_forms(rank, sub, "group [1, 0]")
    # 16-bit inputs reduce in float32 in group-rank order: every rank's rows are those of an
    # allreduce of the products.
    x1 = torch.randn(world * 4, 16, generator=torch.Generator().manual_seed(rank)).to(torch.bfloat16)
    x2 = torch.randn(16, 8, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    got = symm.mc2.fused_matmul_reduce_scatter(x1, x2)
    full = x1 @ x2
    symm.shmem_allreduce(full, "sum")
    assert torch.equal(got, full[rank * 4 : (rank + 1) * 4]), "bf16 rows equal those of an allreduce"

    inv = symm.InvalidArgument
    a, b = torch.randn(4, 3), torch.randn(3, 2)
    c, g = torch.empty(world * 4, 2), torch.empty(world * 4, 3)
    f = symm.mc2.fused_all_gather_matmul
    expect(inv, lambda: f(a, torch.randn(4, 2), c, g), "b", "expected 3 rows", rank=rank)
    expect(inv, lambda: f(a, b, torch.empty(4, 2), g), "c", "contiguous", rank=rank)
    expect(inv, lambda: f(a, b, c, g.t()), "gather_out", rank=rank)
    expect(inv, lambda: f(a, b.double(), c, g), "b", "float64", rank=rank)
    expect(inv, lambda: f(a, b, c, g, torch.zeros(4)), "signal", "int32", rank=rank)
    expect(inv, lambda: f(a, b, c, g, None, 0), "block_size", rank=rank)
    expect(inv, lambda: f(a.view(-1), b, c, g), "a", "2-D", rank=rank)
    r = symm.mc2.fused_matmul_reduce_scatter
    expect(inv, lambda: r(torch.randn(world * 2 + 1, 3), b), "x1", "multiple of the group's size", rank=rank)
    expect(inv, lambda: r(torch.randn(world * 2, 3), b, reduce_op="max"), "reduce_op", rank=rank)
    # After refusals (their peers' rounds rejected), the group still works.
    fused = symm.mc2.fused_matmul_reduce_scatter(torch.ones(world * 2, 3), torch.ones(3, 2))
    assert torch.equal(fused, torch.full((2, 2), 3.0 * world))
    symm.barrier()


def _torch_unfused_ag(A_shard, Bs, gather_dim, group):
    parts = [torch.empty_like(A_shard) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, A_shard.contiguous(), group=group)
    A = torch.cat(parts, dim=gather_dim)
    return A, [A @ B for B in Bs]


def torch_ops(rank, world):
    """PyTorch's ``symm_mem`` operators on CPU, as PyTorch's AsyncTPTest checks them."""
    mc2.register_torch_ops()
    group = dist.group.WORLD
    name = group.group_name
    torch.manual_seed(42 + rank)
    for gather_dim in (0, 1, 2):
        full = [8, 64, 32]
        full[gather_dim] //= world
        A_shard = torch.rand(full)
        Bs = [torch.rand(32, 16) for _ in range(3)]
        # Every rank multiplies by the same Bs.
        for B in Bs:
            dist.broadcast(B, 0)
        A, outs = torch.ops.symm_mem.fused_all_gather_matmul(A_shard, Bs, gather_dim, name)
        A_ref, outs_ref = _torch_unfused_ag(A_shard, Bs, gather_dim, group)
        assert torch.equal(A, A_ref) and A.stride() == A_ref.stride(), f"A_gathered, gather_dim {gather_dim}"
        for o, r in zip(outs, outs_ref):
            assert torch.allclose(o, r) and o.stride() == r.stride(), f"outputs, gather_dim {gather_dim}"
        none, _ = torch.ops.symm_mem.fused_all_gather_matmul(A_shard, Bs, gather_dim, name, return_A=False)
        assert none is None
    A = torch.rand(8, 64, 1024)
    B = torch.rand(1024, 16)
    dist.broadcast(B, 0)
    for scatter_dim in (0, 1, 2):
        if (A @ B).shape[scatter_dim] % world:
            continue
        out = torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, "avg", scatter_dim, name)
        product = A @ B
        total = product.clone()
        dist.all_reduce(total)
        want = torch.tensor_split(total / world, world, dim=scatter_dim)[rank].contiguous()
        assert torch.allclose(out, want, atol=1e-3), f"matmul + reduce_scatter, scatter_dim {scatter_dim}"
        assert out.stride() == want.stride(), (out.stride(), want.stride())

    # Under torch.compile: the graph keeps the operator (PyTorch's meta kernel traces it).
    def step(a, bs):
        return torch.ops.symm_mem.fused_all_gather_matmul(a, bs, 0, name)[1][0].sum()

    A_shard = torch.rand(4, 32)
    B = torch.rand(32, 8)
    dist.broadcast(B, 0)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    assert torch.allclose(compiled(A_shard, [B]), step(A_shard, [B])), "compiled result"
    symm.barrier()


class Replicated(torch.autograd.Function):
    """A parameter every rank holds the same copy of: its gradient is the sum of every rank's
    (what DDP's all-reduce makes of it), by Gloo."""

    @staticmethod
    def forward(ctx, b):
        return b.view_as(b)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous().clone()
        dist.all_reduce(g)
        return g


def gradients(rank, world):
    """gradcheck in float64 through both HyperParallel forms, as scenarios_autograd.py does it:
    every rank runs the same global function of the same inputs (its rows handed out by
    Scatter, the outputs stacked by Gather, a replicated ``b``'s gradient summed)."""
    from scenarios_autograd import Gather, Scatter, global_input

    group = dist.group.WORLD
    m, k, n = 2, 3, 2
    X = global_input(world, m, k)
    b = global_input(1, k, n, seed=1)[0].detach().requires_grad_()

    def ag(X, b):
        c = torch.empty(world * m, n, dtype=torch.float64)
        g = torch.empty(world * m, k, dtype=torch.float64)
        gathered, c = symm.mc2.fused_all_gather_matmul(Scatter.apply(X, group), Replicated.apply(b), c, g, block_size=1)
        return Gather.apply(gathered, group), Gather.apply(c, group)

    assert torch.autograd.gradcheck(ag, (X, b), eps=1e-6, atol=1e-7, rtol=1e-5), "all-gather + matmul"
    X1 = global_input(world, world * m, k, seed=2)
    for op in ("sum", "avg"):

        def mr(X1, b, op=op):
            x1 = Scatter.apply(X1, group)
            out = symm.mc2.fused_matmul_reduce_scatter(x1, Replicated.apply(b), reduce_op=op, block_size=1)
            return Gather.apply(out, group)

        assert torch.autograd.gradcheck(mr, (X1, b), eps=1e-6, atol=1e-7, rtol=1e-5), f"matmul + reduce_scatter ({op})"
    # Without grad mode, nothing is recorded.
    with torch.no_grad():
        c = torch.empty(world * m, n, dtype=torch.float64)
        _, c = symm.mc2.fused_all_gather_matmul(X[rank], b, c, torch.empty(world * m, k, dtype=torch.float64))
    assert c.grad_fn is None
    symm.barrier()
