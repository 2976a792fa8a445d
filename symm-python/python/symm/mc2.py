"""MC2 fused operators (PyTorch): all-gather + matmul and matmul + reduce-scatter, pipelined.

HyperParallel's API::

    gather_out, c = symm.fused_all_gather_matmul(a, b, c, gather_out, signal)
    out = symm.fused_matmul_reduce_scatter(x1, x2, symm_tensor, signal, reduce_op="sum")

and, once ``symm`` is imported, PyTorch's own operators on CPU tensors (PyTorch registers them
for CUDA only)::

    torch.ops.symm_mem.fused_all_gather_matmul(A, [B0, B1], gather_dim, group_name)
    torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, "avg", scatter_dim, group_name)

**Pipelined.** Each operator is a pairwise exchange (step s: send to rank ``me + s``, receive
from ``me - s``), each peer's rows cut into blocks of ``block_size``: the transfer of one block
runs as an asynchronous symm ``sendrecv`` on the rank's progress thread while the caller
multiplies the neighbouring block (its own rows first). A received block lands straight in its
place of ``gather_out``; matmul + reduce-scatter sends each product block to the rank that owns
it and reduces what it received in group-rank order, in float32 for 16-bit data, as symm's
collectives do.

**What differs from HyperParallel's code** (its torch handlers):

- ``fused_all_gather_matmul`` computes ``c = gather_out @ b`` (its docstring's
  "ReduceScatter(gather_out @ b)" is not what the code does; symm follows the code).
- HyperParallel's signals are set to 1 and never reset, so a second call with the same
  ``signal`` reads stale data, and they need ``world x blocks`` slots. symm's collectives carry
  their own flags: ``signal`` is accepted for the signature (an int32 tensor, or None) and
  neither read nor written, so repeated calls with the same tensors are correct.
- ``fused_matmul_reduce_scatter`` reduces in group-rank order with float32 accumulation for 16-
  and 8-bit inputs (HyperParallel accumulates in the input dtype in a different order on each
  rank): every rank's rows are what an allreduce of ``x1 @ x2`` would give it.
- ``gather_out`` and ``symm_tensor`` need not be symmetric tensors (any contiguous tensor of the
  right shape; ``symm_tensor``, where it fits, holds the product before it is reduced).

**Differentiable.** With grad mode on and ``a``/``b`` (``x1``/``x2``) requiring grad, the
HyperParallel forms record their backward: all-gather + matmul: ``grad_a`` is the
reduce-scatter (sum) of ``grad_c @ b^T``, ``grad_b`` is ``gather_out^T @ grad_c``; matmul +
reduce-scatter: ``grad_out`` is all-gathered (divided by the group's size for ``avg``), then
``grad_x1 = G @ x2^T`` and ``grad_x2 = x1^T @ G``. Like every collective, the backward is
collective: the ranks run it in the same order.
"""

from __future__ import annotations

import os
from typing import Any, List, Optional, Sequence, Tuple

import torch

from . import _api
from ._symm import shmem_allgather, shmem_reduce_scatter, shmem_sendrecv

__all__ = ["fused_all_gather_matmul", "fused_matmul_reduce_scatter", "DEFAULT_BLOCKS"]

#: Blocks a pipelined call cuts each peer's rows into when ``block_size`` is not given (fewer
#: where the rows are few).
DEFAULT_BLOCKS = 4


def _check(ok: bool, group: Any, arg: str, value: Any, reason: str) -> None:
    """Refuses ``arg`` (rejecting the group's next collective, so that peers fail at once)."""
    if not ok:
        raise _api._rejected(group, arg, value, reason)


def _shape(t: Any) -> str:
    return f"<{type(t).__name__}>" if not isinstance(t, torch.Tensor) else f"{tuple(t.shape)} {t.dtype}"


def _blocks(rows: int, block_size: Optional[int], group: Any) -> List[Tuple[int, int]]:
    """``(first row, rows)`` of each block of ``rows`` rows."""
    if block_size is None:
        block_size = max(1, -(-rows // DEFAULT_BLOCKS))
    _check(
        isinstance(block_size, int) and not isinstance(block_size, bool) and block_size > 0,
        group,
        "block_size",
        block_size,
        "expected a positive number of rows",
    )
    return [(lo, min(block_size, rows - lo)) for lo in range(0, rows, block_size)]


def _exchanges(world: int, me: int, blocks: List[Tuple[int, int]]) -> List[Tuple[int, int, Tuple[int, int]]]:
    """``(rank sent to, rank received from, block)`` of each exchange, in issue order: the
    ranks at distance 1 .. world - 1, each block of rows (a pairwise exchange: every step is a
    permutation, so no rank waits for one that waits for it)."""
    return [((me + s) % world, (me - s) % world, block) for s in range(1, world) for block in blocks]


def _pipelined(block_size: Optional[int]) -> bool:
    """Whether to pipeline: as asked (``block_size`` given), else where each rank has a core
    to spare for its progress thread. With one core per rank the transfer and the matmul take
    turns on it, and the hand-overs only add time (docs/performance.md, "MC2 fused
    operators"): the call is then the plain collective and one matmul."""
    if block_size is not None:
        return True
    return len(os.sched_getaffinity(0)) >= 2 * _api._current().comm.world_size


def _all_gather_matmul(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, gather_out: torch.Tensor, block_size: Optional[int], group: Any
) -> None:
    """``gather_out = all_gather(a)``, ``c = gather_out @ b``: each block of a peer's rows is
    received straight into its place in ``gather_out`` (contiguous: no staging) while the
    previous block is multiplied."""
    if not _pipelined(block_size):
        shmem_allgather(gather_out, a, group=group)
        torch.mm(gather_out, b, out=c)
        return
    world, me = _api._group_size_rank(group)
    m = a.shape[0]
    steps = _exchanges(world, me, _blocks(m, block_size, group))

    def rows(p: int, lo: int, n: int) -> slice:
        return slice(p * m + lo, p * m + lo + n)

    def start(step: Tuple[int, int, Tuple[int, int]]) -> Any:
        dst, src, (lo, n) = step
        return shmem_sendrecv(a[lo : lo + n], dst, gather_out[rows(src, lo, n)], src, group=group, async_op=True)

    pending = start(steps[0]) if steps else None
    # This rank's own rows are multiplied while the first exchange travels.
    mine = rows(me, 0, m)
    gather_out[mine].copy_(a)
    torch.mm(gather_out[mine], b, out=c[mine])
    for i, (_, src, (lo, n)) in enumerate(steps):
        pending.wait()
        if i + 1 < len(steps):
            pending = start(steps[i + 1])
        torch.mm(gather_out[rows(src, lo, n)], b, out=c[rows(src, lo, n)])


def _matmul_reduce_scatter(
    x1: torch.Tensor,
    x2: torch.Tensor,
    out: torch.Tensor,
    op: str,
    block_size: Optional[int],
    group: Any,
    stage: Optional[torch.Tensor] = None,
) -> None:
    """``out = reduce_scatter(x1 @ x2)`` along dim 0: each block of the product a peer owns is
    sent to it as soon as it is multiplied (while the next one is), then the parts this rank
    received are reduced in group-rank order, in float32 for 16-bit data, as symm's collectives
    reduce. ``stage``, when it fits, holds the product (no allocation)."""
    if not _pipelined(block_size):
        shape = (x1.shape[0], x2.shape[1])
        fits = (
            stage is not None
            and stage.dtype == x1.dtype
            and stage.is_contiguous()
            and stage.numel() == shape[0] * shape[1]
        )
        product = stage.view(shape) if fits else torch.empty(shape, dtype=x1.dtype)
        shmem_reduce_scatter(out, torch.mm(x1, x2, out=product), op, group=group)
        return
    world, me = _api._group_size_rank(group)
    m = x1.shape[0] // world
    received = torch.empty((world, m, x2.shape[1]), dtype=x1.dtype)
    works = []
    for dst, src, (lo, n) in _exchanges(world, me, _blocks(m, block_size, group)):
        product = torch.mm(x1[dst * m + lo : dst * m + lo + n], x2, out=torch.empty((n, x2.shape[1]), dtype=x1.dtype))
        works.append(shmem_sendrecv(product, dst, received[src, lo : lo + n], src, group=group, async_op=True))
    torch.mm(x1[me * m : (me + 1) * m], x2, out=received[me])
    for w in works:
        w.wait()
    wide = torch.float32 if x1.dtype in (torch.float16, torch.bfloat16) else x1.dtype
    acc = received[0].to(wide, copy=True)
    for p in range(1, world):
        acc += received[p]
    if op == "avg":
        acc /= world
    out.copy_(acc)


class _AllGatherMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, a, b, c, gather_out, block_size, group):  # type: ignore[no-untyped-def]
        _all_gather_matmul(a, b, c, gather_out, block_size, group)
        ctx.mark_dirty(c, gather_out)
        ctx.save_for_backward(b, gather_out)
        ctx.group, ctx.block_size = group, block_size
        return gather_out, c

    @staticmethod
    def backward(ctx: Any, grad_gathered, grad_c):  # type: ignore[no-untyped-def]
        b, gather_out = ctx.saved_tensors
        grad_a = grad_b = None
        if grad_c is not None:
            if ctx.needs_input_grad[0]:
                rows = torch.matmul(grad_c, b.t()).contiguous()
                if grad_gathered is not None:
                    rows = rows + grad_gathered
                world, _ = _api._group_size_rank(ctx.group)
                grad_a = torch.empty((rows.shape[0] // world, rows.shape[1]), dtype=rows.dtype)
                shmem_reduce_scatter(grad_a, rows, "sum", group=ctx.group)
            if ctx.needs_input_grad[1]:
                grad_b = torch.matmul(gather_out.t(), grad_c)
        return grad_a, grad_b, None, None, None, None


class _MatmulReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x1, x2, op, block_size, group):  # type: ignore[no-untyped-def]
        world, _ = _api._group_size_rank(group)
        out = torch.empty((x1.shape[0] // world, x2.shape[1]), dtype=x1.dtype)
        _matmul_reduce_scatter(x1, x2, out, op, block_size, group)
        ctx.save_for_backward(x1, x2)
        ctx.op, ctx.group = op, group
        return out

    @staticmethod
    def backward(ctx: Any, grad_out):  # type: ignore[no-untyped-def]
        x1, x2 = ctx.saved_tensors
        world, _ = _api._group_size_rank(ctx.group)
        g = torch.empty((world * grad_out.shape[0], grad_out.shape[1]), dtype=grad_out.dtype)
        shmem_allgather(g, grad_out.contiguous(), group=ctx.group)
        if ctx.op == "avg":
            g = g / world
        grad_x1 = torch.matmul(g, x2.t()) if ctx.needs_input_grad[0] else None
        grad_x2 = torch.matmul(x1.t(), g) if ctx.needs_input_grad[1] else None
        return grad_x1, grad_x2, None, None, None


def _matrix(t: Any, arg: str, group: Any, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    ok = isinstance(t, torch.Tensor) and t.dim() == 2 and t.is_cpu
    _check(ok, group, arg, _shape(t), "expected a 2-D CPU torch.Tensor")
    if dtype is not None:
        _check(t.dtype == dtype, group, arg, _shape(t), f"expected dtype {dtype} (the other operands')")
    return t


def _signal(signal: Any, group: Any) -> None:
    ok = signal is None or (isinstance(signal, torch.Tensor) and signal.dtype == torch.int32)
    _check(ok, group, "signal", _shape(signal), "expected an int32 tensor or None (symm does not use it)")


def _wants_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def fused_all_gather_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    gather_out: torch.Tensor,
    signal: Optional[torch.Tensor] = None,
    block_size: Optional[int] = None,
    group: Any = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """All-gather of ``a`` along dim 0 into ``gather_out``, and ``c = gather_out @ b``, pipelined
    by blocks of ``block_size`` rows of ``a`` (default: ``a``'s rows in ``DEFAULT_BLOCKS`` blocks
    where each rank has a core to spare, else not pipelined). Collective over ``group``.

    Args:
        a: ``(m, k)``, this rank's rows. b: ``(k, n)``. c: ``(world * m, n)``, written.
        gather_out: ``(world * m, k)``, written: rank p's ``a`` at rows ``p * m``.
        signal: HyperParallel's signal tensor: accepted (int32, or None), not used (see the
            module's docs).
        block_size: rows of ``a`` per pipelined block (given: pipelined in any case).

    Returns:
        ``(gather_out, c)``; with grad mode on and ``a`` or ``b`` requiring grad, ``c`` carries
        the backward (``grad_a``: reduce-scatter of ``grad_c @ b^T``; ``grad_b``:
        ``gather_out^T @ grad_c``).
    """
    world, _ = _api._group_size_rank(group)
    a = _matrix(a, "a", group)
    b = _matrix(b, "b", group, a.dtype)
    c = _matrix(c, "c", group, a.dtype)
    gather_out = _matrix(gather_out, "gather_out", group, a.dtype)
    m, k = a.shape
    _check(b.shape[0] == k, group, "b", _shape(b), f"expected {k} rows (a's columns)")
    want = (world * m, b.shape[1])
    _check(
        tuple(c.shape) == want and c.is_contiguous(),
        group,
        "c",
        _shape(c),
        f"expected a contiguous {want}",
    )
    want = (world * m, k)
    _check(
        tuple(gather_out.shape) == want and gather_out.is_contiguous(),
        group,
        "gather_out",
        _shape(gather_out),
        f"expected a contiguous {want}",
    )
    _signal(signal, group)
    _blocks(m, block_size, group)
    a, b = a.contiguous(), b.contiguous()
    if _wants_grad(a, b):
        return _AllGatherMatmul.apply(a, b, c, gather_out, block_size, group)
    _all_gather_matmul(a, b, c, gather_out, block_size, group)
    return gather_out, c


def fused_matmul_reduce_scatter(
    x1: torch.Tensor,
    x2: torch.Tensor,
    symm_tensor: Optional[torch.Tensor] = None,
    signal: Optional[torch.Tensor] = None,
    reduce_op: str = "sum",
    block_size: Optional[int] = None,
    group: Any = None,
) -> torch.Tensor:
    """The reduce-scatter along dim 0 of ``x1 @ x2``: this rank's ``(M / world, n)`` rows of the
    group's sum (or average) of every rank's product, pipelined by blocks of ``block_size`` rows
    of the result. Collective over ``group``.

    Args:
        x1: ``(M, k)``, ``M`` a multiple of the group's size. x2: ``(k, n)``.
        symm_tensor, signal: HyperParallel's staging tensor and signal: ``symm_tensor``, when it
            holds ``M x n`` elements of ``x1``'s dtype contiguously, stages the product (saving
            an allocation), else it is not used; ``signal`` is not used
            (symm's collectives stage and signal themselves; see the module's docs).
        reduce_op: ``"sum"`` or ``"avg"``.

    Returns:
        A new ``(M / world, n)`` tensor; with grad mode on and ``x1`` or ``x2`` requiring grad it
        carries the backward (an all-gather of ``grad_out``).
    """
    world, _ = _api._group_size_rank(group)
    x1 = _matrix(x1, "x1", group)
    x2 = _matrix(x2, "x2", group, x1.dtype)
    _check(
        x2.shape[0] == x1.shape[1],
        group,
        "x2",
        _shape(x2),
        f"expected {x1.shape[1]} rows (x1's columns)",
    )
    _check(
        x1.shape[0] % world == 0,
        group,
        "x1",
        _shape(x1),
        f"rows must be a multiple of the group's size {world}",
    )
    ok = symm_tensor is None or isinstance(symm_tensor, torch.Tensor)
    _check(ok, group, "symm_tensor", _shape(symm_tensor), "expected a tensor or None (symm does not use it)")
    _signal(signal, group)
    _check(reduce_op in ("sum", "avg"), group, "reduce_op", repr(reduce_op), "expected 'sum' or 'avg'")
    _blocks(x1.shape[0] // world, block_size, group)
    x1, x2 = x1.contiguous(), x2.contiguous()
    if _wants_grad(x1, x2):
        return _MatmulReduceScatter.apply(x1, x2, reduce_op, block_size, group)
    out = torch.empty((x1.shape[0] // world, x2.shape[1]), dtype=x1.dtype)
    _matmul_reduce_scatter(x1, x2, out, reduce_op, block_size, group, symm_tensor)
    return out


# --------------------------------------------------------------------------------------------
# PyTorch's operators (torch.ops.symm_mem), on CPU tensors
# --------------------------------------------------------------------------------------------


def _group_of(group_name: str) -> Any:
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(group_name)


def _torch_all_gather_matmul(
    A: torch.Tensor, Bs: Sequence[torch.Tensor], gather_dim: int, group_name: str, return_A: bool = True
) -> Tuple[Optional[torch.Tensor], List[torch.Tensor]]:
    group = _group_of(group_name)
    world, _ = _api._group_size_rank(group)
    dim = gather_dim % A.dim()
    shard = A.movedim(dim, 0).contiguous()
    rows = shard.reshape(shard.shape[0], -1)
    gathered = torch.empty((world * rows.shape[0], rows.shape[1]), dtype=A.dtype)
    shmem_allgather(gathered, rows, group=group)
    A_gathered = gathered.view(world * shard.shape[0], *shard.shape[1:]).movedim(0, dim).contiguous()
    outputs = [torch.matmul(A_gathered, B) for B in Bs]
    return (A_gathered if return_A else None), outputs


def _torch_matmul_reduce_scatter(
    A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int, group_name: str
) -> torch.Tensor:
    group = _group_of(group_name)
    world, _ = _api._group_size_rank(group)
    _check(reduce_op in ("sum", "avg"), group, "reduce_op", repr(reduce_op), "expected 'sum' or 'avg'")
    product = torch.matmul(A, B)
    dim = scatter_dim % product.dim()
    _check(
        product.shape[dim] % world == 0,
        group,
        "scatter_dim",
        scatter_dim,
        f"the product's dim {dim} ({product.shape[dim]}) is no multiple of the group's size {world}",
    )
    moved = product.movedim(dim, 0).contiguous()
    part = torch.empty((moved.shape[0] // world, *moved.shape[1:]), dtype=A.dtype)
    shmem_reduce_scatter(part.view(part.shape[0], -1), moved.view(moved.shape[0], -1), reduce_op, group=group)
    return part.movedim(0, dim).contiguous()


_registered = False


def register_torch_ops() -> None:
    """Gives PyTorch's ``symm_mem`` fused operators a CPU kernel over symm (once)."""
    global _registered
    if _registered:
        return
    import torch.distributed._symmetric_memory  # noqa: F401 - defines the symm_mem schemas

    lib = torch.library.Library("symm_mem", "IMPL")
    lib.impl("fused_all_gather_matmul", _torch_all_gather_matmul, "CPU")
    lib.impl("fused_matmul_reduce_scatter", _torch_matmul_reduce_scatter, "CPU")
    # Kept alive with the module: dropping a Library deregisters its kernels.
    globals()["_library"] = lib
    _registered = True
