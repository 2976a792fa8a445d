"""symm next to torch.distributed (Gloo) in one training step: the RFC's mixed step.

4 ranks as a 2 x 2 mesh: data-parallel groups {0, 2} and {1, 3}, tensor-parallel groups {0, 1}
and {2, 3}. A small tensor-parallel model: each rank holds a column shard of the first layer,
the TP group all-gathers the activations with Gloo (async work), and the DP group averages the
gradients with symm (blocking on even steps, ``async_op=True`` on odd ones, while a Gloo
all-gather of the TP group is in flight too). Random pauses between calls, and symm's progress
delayed (``SYMM_STREAM_DELAY_US``). The same steps with Gloo's all-reduce in place of symm's
are the reference: with two members per DP group the sum of two values is the same in either
order, so parameters and losses must be equal bit for bit.
"""

import os
import random
import time

import symm
import torch
import torch.distributed as dist


def _groups(kind, rank):
    """The DP and TP groups of ``rank``, made the way ``kind`` names."""
    if kind == "new_group":
        dp = [dist.new_group([0, 2]), dist.new_group([1, 3])]
        tp = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        return dp[rank % 2], tp[rank // 2]
    if kind == "hyperparallel":
        # HyperParallel's conventions: create_group for the DP groups, split_group of the world
        # for the TP groups (non-members of a split get None).
        dp = [symm.create_group([0, 2]), symm.create_group([1, 3])]
        tp = [symm.split_group(None, [0, 1]), symm.split_group(None, [2, 3])]
        return dp[rank % 2], tp[rank // 2]
    if kind == "device_mesh":
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        return mesh.get_group("dp"), mesh.get_group("tp")
    raise ValueError(kind)


def _pause(rng):
    time.sleep(rng.random() * 0.004)


def _train(rank, dp, tp, use_symm, steps=4):
    """Parameters and losses after ``steps`` steps; DP gradients averaged by symm or by Gloo."""
    dp_rank = dist.get_process_group_ranks(dp).index(rank)
    tp_ranks = dist.get_process_group_ranks(tp)
    tp_rank = tp_ranks.index(rank)
    d, k, b = 16, 8, 4
    w1 = torch.randn(d, k, generator=torch.Generator().manual_seed(100 + tp_rank)) * 0.3
    w2 = torch.randn(2 * k, 1, generator=torch.Generator().manual_seed(7)) * 0.3
    rng = random.Random(31 * rank + int(use_symm))
    losses = []
    for step in range(steps):
        # The same batch on both TP ranks of a DP replica.
        x = torch.randn(b, d, generator=torch.Generator().manual_seed(1000 * step + dp_rank))
        w1_, w2_ = w1.clone().requires_grad_(), w2.clone().requires_grad_()
        h_local = torch.tanh(x @ w1_)
        parts = [torch.empty_like(h_local) for _ in tp_ranks]
        gathered = dist.all_gather(parts, h_local.detach().contiguous(), group=tp, async_op=True)
        _pause(rng)
        gathered.wait()
        # Every TP rank computes the same loss on the whole activation; its own shard keeps the
        # graph, so its gradient is its slice of the whole one.
        parts[tp_rank] = h_local
        loss = ((torch.cat(parts, dim=1) @ w2_) ** 2).mean()
        loss.backward()
        grads = [w1_.grad, w2_.grad]
        probe = [torch.empty(3) for _ in tp_ranks]
        if not use_symm:
            for g in grads:
                dist.all_reduce(g, group=dp)
                g /= 2
            dist.all_gather(probe, torch.full((3,), float(rank)), group=tp)
        elif step % 2 == 0:
            for g in grads:
                symm.shmem_allreduce(g, "avg", group=dp)
                _pause(rng)
            dist.all_gather(probe, torch.full((3,), float(rank)), group=tp)
        else:
            works = [symm.shmem_allreduce(g, "avg", group=dp, async_op=True) for g in grads]
            # Gloo's work in the TP group while symm's is in flight in the DP group.
            other = dist.all_gather(probe, torch.full((3,), float(rank)), group=tp, async_op=True)
            _pause(rng)
            other.wait()
            for w in works:
                w.wait()
        assert [p[0].item() for p in probe] == [float(r) for r in tp_ranks], probe
        w1 = w1 - 0.1 * grads[0]
        w2 = w2 - 0.1 * grads[1]
        losses.append(loss.detach())
    return w1, w2, losses


def mixed_training_step(rank, world):
    assert world == 4
    kind = os.environ["SYMM_TEST_GROUPS"]
    dp, tp = _groups(kind, rank)
    w1, w2, losses = _train(rank, dp, tp, use_symm=True)
    r1, r2, ref_losses = _train(rank, dp, tp, use_symm=False)
    for step, (a, b) in enumerate(zip(losses, ref_losses)):
        assert torch.equal(a, b), f"rank {rank} ({kind}): loss of step {step}: {a.item()!r} vs Gloo's {b.item()!r}"
    assert torch.equal(w1, r1) and torch.equal(w2, r2), f"rank {rank} ({kind}): parameters differ from Gloo's"
    # The DP replicas agree with each other too.
    both = [torch.empty_like(w1) for _ in range(2)]
    dist.all_gather(both, w1, group=dp)
    assert torch.equal(both[0], both[1]), f"rank {rank}: DP replicas differ"
    symm.barrier()


def forbidden_patterns_are_refused(rank, world):
    """Under SYMM_VALIDATE=1: the two libraries on one tensor's memory at once are refused."""
    from scenarios import expect

    # One phase of one tensor split between the libraries: symm reduces the first half of a
    # flat buffer while Gloo would reduce the second half.
    # Rank r joins symm's allreduce 0.3 s after rank r - 1, so that on every rank but the last
    # it is still in flight (waiting for the last rank) when Gloo's call is made; the last rank,
    # whose arrival completes it, makes no Gloo call (it would wait for peers that never come).
    flat = torch.ones(2048)
    time.sleep(0.3 * rank)
    work = symm.shmem_allreduce(flat[:1024], "sum", async_op=True)
    if rank < world - 1:
        expect(
            symm.InvalidArgument,
            lambda: dist.all_reduce(flat[1024:], async_op=True),
            "torch.distributed (gloo) all_reduce refused",
            "symm's asynchronous allreduce",
            "one phase of one tensor is never split between two libraries",
            rank=rank,
        )
    work.wait()
    assert torch.equal(flat[:1024], torch.full((1024,), float(world))), flat[:4]
    # Once symm's work has completed, Gloo may use the memory.
    dist.all_reduce(flat[1024:])
    assert torch.equal(flat[1024:], torch.full((1024,), float(world))), flat[1024:1028]

    # A symm call on memory an unfinished Gloo work still writes: every rank's irecv waits for
    # a send that comes later. The same tensor, and another view of its storage (the phase
    # split the other way round).
    whole = torch.zeros(8)
    buf = whole[4:]
    incoming = dist.irecv(buf, src=(rank - 1) % world)
    for view in (buf, whole[:4]):
        expect(
            symm.InvalidArgument,
            lambda view=view: symm.shmem_allreduce(view, "sum"),
            "invalid argument: tensor",
            "unfinished asynchronous irecv of torch.distributed (gloo)",
            rank=rank,
        )
    # Other memory is free to use meanwhile, also in place of the fast path.
    other = torch.ones(8)
    symm.shmem_allreduce(other, "sum")
    assert torch.equal(other, torch.full((8,), float(world))), other
    dist.send(torch.full((4,), float(rank)), dst=(rank + 1) % world)
    incoming.wait()
    assert torch.equal(buf, torch.full((4,), float((rank - 1) % world))), buf
    symm.shmem_allreduce(buf, "sum")
    symm.barrier()
