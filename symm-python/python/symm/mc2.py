"""MC2 fused operators (PyTorch): all-gather + matmul and matmul + reduce-scatter, pipelined.

HyperParallel's API::

    gather_out, c = symm.fused_all_gather_matmul(a, b, c, gather_out, signal)
    out = symm.fused_matmul_reduce_scatter(x1, x2, symm_tensor, signal, reduce_op="sum")

and, once ``symm`` is imported, PyTorch's own operators on CPU tensors, and on npu tensors where
torch_npu is loaded (PyTorch registers them for CUDA only)::

    torch.ops.symm_mem.fused_all_gather_matmul(A, [B0, B1], gather_dim, group_name)
    torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, "avg", scatter_dim, group_name)

**Pipelined.** Each operator is a pairwise exchange (step s: send to rank ``me + s``, receive
from ``me - s``), each peer's rows cut into blocks of ``block_size``: the transfer of one block
runs as an asynchronous symm ``sendrecv`` while the caller multiplies the neighbouring block
(its own rows first). A received block lands straight in its place of ``gather_out``; matmul +
reduce-scatter sends each product block to the rank that owns it and reduces what it received
in group-rank order, in float32 for 16-bit data, as symm's collectives do.

**Devices.** The operands are CPU tensors or npu tensors (torch_npu), all on one device. The
algorithm is written once over an ordering (``_Order``): on the CPU the transfers run on the
rank's progress thread and the host waits for each before reading its block (``_HostOrder``);
on a device they run on a side stream of the device while the matmuls run on the caller's
current stream, ordered by events without the host waiting (``_StreamOrder``), and the call
returns once its work is enqueued, as the device's own operators do. PyTorch's operators are
not pipelined: the collective (on the caller's current stream), then the matmul; their npu
kernels are registered on torch_npu's key (PrivateUse1) where torch_npu has none of its own.

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
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

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
    """Whether to pipeline on the CPU: as asked (``block_size`` given), else where each rank has
    a core to spare for its progress thread. With one core per rank the transfer and the matmul
    take turns on it, and the hand-overs only add time (docs/performance.md, "MC2 fused
    operators"): the call is then the plain collective and one matmul."""
    if block_size is not None:
        return True
    return len(os.sched_getaffinity(0)) >= 2 * _api._current().comm.world_size


class _Order:
    """How the exchanges of a pipelined call are ordered with the caller's compute: the
    algorithm calls ``inputs_ready`` before exchanges that read or write what the caller's
    compute touched, ``exchange`` for each transfer (a handle back), ``ready(handle)`` before
    the compute that reads the block received, and ``finish`` at the end."""

    def inputs_ready(self) -> None:
        """The exchanges issued from now on come after the caller's compute issued so far."""

    def exchange(self, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int, group: Any) -> Any:
        raise NotImplementedError

    def ready(self, handle: Any) -> None:
        """The caller's compute issued from now on comes after the exchange of ``handle``."""
        raise NotImplementedError

    def finish(self) -> None:
        """The caller's compute issued from now on comes after every exchange of the call."""


class _HostOrder(_Order):
    """CPU operands: each exchange is an asynchronous symm call on the rank's progress thread,
    waited for on the host before its block is read. The host has finished its compute when it
    issues an exchange, so ``inputs_ready`` has nothing to do, nor ``finish``: every exchange
    was waited for."""

    def exchange(self, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int, group: Any) -> Any:
        return shmem_sendrecv(send, dst, recv, src, group=group, async_op=True)

    def ready(self, handle: Any) -> None:
        handle.wait()


class _StreamOrder(_Order):
    """Device operands: the exchanges run on a side stream of the device (``streams``: the
    platform's ``caller_stream``, ``side_stream`` and ``using_stream``; the streams' own
    ``wait_stream``, ``record_event`` and ``wait_event``), the compute on the caller's current
    stream, ordered by the device without the host waiting:

    - ``inputs_ready``: the side stream waits for the caller's stream (the blocks it sends are
      written, the memory it receives into is no longer in use);
    - ``exchange``: the asynchronous symm call enqueued on the side stream (symm's device calls
      run on the current stream, made the side one for it), then an event recorded after it;
    - ``ready``: the caller's stream waits for that event;
    - ``finish``: the caller's stream waits for the side stream.

    Every tensor an exchange reads or writes is held by its symm work until the side stream's
    operation is seen complete, so the caching allocator cannot hand the memory to anyone
    meanwhile, whatever the stream it was allocated on: no ``record_stream`` is needed. The call
    returns without the host waiting; an exchange that failed is reported by the next call on
    the device (``_settle``)."""

    def __init__(self, streams: Any, device: torch.device, group: Any) -> None:
        _settle(device, group)
        self.streams = streams
        self.current = streams.caller_stream(device)
        self.side = streams.side_stream(device)
        self.works = _unsettled.setdefault(device, [])

    def inputs_ready(self) -> None:
        self.side.wait_stream(self.current)

    def exchange(self, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int, group: Any) -> Any:
        with self.streams.using_stream(self.side):
            self.works.append(shmem_sendrecv(send, dst, recv, src, group=group, async_op=True))
        return self.side.record_event()

    def ready(self, handle: Any) -> None:
        self.current.wait_event(handle)

    def finish(self) -> None:
        self.current.wait_stream(self.side)


#: The works of the device calls' exchanges whose completion was not seen yet, per device, in
#: issue order.
_unsettled: Dict[torch.device, List[Any]] = {}


def _settle(device: torch.device, group: Any) -> None:
    """Forgets the exchanges of earlier calls on ``device`` seen complete, without waiting, and
    raises the error of one that failed (rejecting the group's next collective, so that its
    peers fail at once rather than at their timeout)."""
    works = _unsettled.get(device, [])
    try:
        while works and works[0].is_completed():
            works.pop(0)
    except Exception:
        works.clear()
        _api._reject(group)
        raise


def _device_streams(device: torch.device) -> Any:
    """The stream interface of ``device`` (see ``_StreamOrder``): the platform's for a device,
    None for the CPU, whose exchanges are ordered by the host."""
    return None if device.type == "cpu" else _api._current().platform


def _order(device: torch.device, block_size: Optional[int], group: Any) -> Optional[_Order]:
    """The ordering of a call on ``device``, or None where it does not pipeline (the CPU without
    a core to spare per rank, ``block_size`` not given). A device always pipelines: its copies
    run beside its compute."""
    streams = _device_streams(device)
    if streams is None:
        return _HostOrder() if _pipelined(block_size) else None
    return _StreamOrder(streams, device, group)


def _all_gather_matmul(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, gather_out: torch.Tensor, block_size: Optional[int], group: Any
) -> None:
    """``gather_out = all_gather(a)``, ``c = gather_out @ b``: each block of a peer's rows is
    received straight into its place in ``gather_out`` (contiguous: no staging) while the
    previous block is multiplied."""
    order = _order(a.device, block_size, group)
    if order is None:
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
        return order.exchange(a[lo : lo + n], dst, gather_out[rows(src, lo, n)], src, group)

    # The exchanges read `a` and write `gather_out`: after the caller's work on them.
    order.inputs_ready()
    pending = start(steps[0]) if steps else None
    # This rank's own rows are multiplied while the first exchange travels.
    mine = rows(me, 0, m)
    gather_out[mine].copy_(a)
    torch.mm(gather_out[mine], b, out=c[mine])
    for i, (_, src, (lo, n)) in enumerate(steps):
        order.ready(pending)
        if i + 1 < len(steps):
            pending = start(steps[i + 1])
        torch.mm(gather_out[rows(src, lo, n)], b, out=c[rows(src, lo, n)])
    order.finish()


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
    order = _order(x1.device, block_size, group)
    if order is None:
        shape = (x1.shape[0], x2.shape[1])
        fits = (
            stage is not None
            and stage.dtype == x1.dtype
            and stage.device == x1.device
            and stage.is_contiguous()
            and stage.numel() == shape[0] * shape[1]
        )
        product = stage.view(shape) if fits else torch.empty(shape, dtype=x1.dtype, device=x1.device)
        shmem_reduce_scatter(out, torch.mm(x1, x2, out=product), op, group=group)
        return
    world, me = _api._group_size_rank(group)
    m = x1.shape[0] // world
    received = torch.empty((world, m, x2.shape[1]), dtype=x1.dtype, device=x1.device)
    handles = []
    for dst, src, (lo, n) in _exchanges(world, me, _blocks(m, block_size, group)):
        block = torch.empty((n, x2.shape[1]), dtype=x1.dtype, device=x1.device)
        product = torch.mm(x1[dst * m + lo : dst * m + lo + n], x2, out=block)
        # The exchange sends the product just computed.
        order.inputs_ready()
        handles.append(order.exchange(product, dst, received[src, lo : lo + n], src, group))
    torch.mm(x1[me * m : (me + 1) * m], x2, out=received[me])
    for h in handles:
        order.ready(h)
    order.finish()
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
                grad_a = torch.empty((rows.shape[0] // world, rows.shape[1]), dtype=rows.dtype, device=rows.device)
                shmem_reduce_scatter(grad_a, rows, "sum", group=ctx.group)
            if ctx.needs_input_grad[1]:
                grad_b = torch.matmul(gather_out.t(), grad_c)
        return grad_a, grad_b, None, None, None, None


class _MatmulReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x1, x2, op, block_size, group):  # type: ignore[no-untyped-def]
        world, _ = _api._group_size_rank(group)
        out = torch.empty((x1.shape[0] // world, x2.shape[1]), dtype=x1.dtype, device=x1.device)
        _matmul_reduce_scatter(x1, x2, out, op, block_size, group)
        ctx.save_for_backward(x1, x2)
        ctx.op, ctx.group = op, group
        return out

    @staticmethod
    def backward(ctx: Any, grad_out):  # type: ignore[no-untyped-def]
        x1, x2 = ctx.saved_tensors
        world, _ = _api._group_size_rank(ctx.group)
        g = torch.empty((world * grad_out.shape[0], grad_out.shape[1]), dtype=grad_out.dtype, device=grad_out.device)
        shmem_allgather(g, grad_out.contiguous(), group=ctx.group)
        if ctx.op == "avg":
            g = g / world
        grad_x1 = torch.matmul(g, x2.t()) if ctx.needs_input_grad[0] else None
        grad_x2 = torch.matmul(x1.t(), g) if ctx.needs_input_grad[1] else None
        return grad_x1, grad_x2, None, None, None


#: The device types whose tensors the operators take.
_DEVICES = ("cpu", "npu")


def _matrix(t: Any, arg: str, group: Any, like: Optional[Tuple[str, torch.Tensor]] = None) -> torch.Tensor:
    """``t``, refused unless a 2-D tensor on the CPU or an npu; with ``like`` (``(name,
    tensor)``: the first operand), on that tensor's device and of its dtype."""
    _check(isinstance(t, torch.Tensor) and t.dim() == 2, group, arg, _shape(t), "expected a 2-D torch.Tensor")
    if like is None:
        _check(t.device.type in _DEVICES, group, arg, _placed(t), f"expected a tensor on {' or '.join(_DEVICES)}")
        return t
    _same_device(t, arg, like, group)
    name, first = like
    _check(t.dtype == first.dtype, group, arg, _shape(t), f"expected dtype {first.dtype} ({name}'s)")
    return t


def _same_device(t: torch.Tensor, arg: str, like: Tuple[str, torch.Tensor], group: Any) -> None:
    name, first = like
    reason = f"expected a tensor on {first.device} ({name}'s device: the operands are on one device)"
    _check(t.device == first.device, group, arg, _placed(t), reason)


def _placed(t: torch.Tensor) -> str:
    return f"{_shape(t)} on {t.device}"


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
    on an npu, and on the CPU where each rank has a core to spare, else not pipelined).
    Collective over ``group``. On an npu it returns once its work is enqueued on the caller's
    current stream (the module's docs).

    Args:
        a: ``(m, k)``, this rank's rows, on the CPU or an npu; every other tensor on its device.
            b: ``(k, n)``. c: ``(world * m, n)``, written.
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
    b = _matrix(b, "b", group, ("a", a))
    c = _matrix(c, "c", group, ("a", a))
    gather_out = _matrix(gather_out, "gather_out", group, ("a", a))
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
    of the result (by default as ``fused_all_gather_matmul``). Collective over ``group``.

    Args:
        x1: ``(M, k)``, ``M`` a multiple of the group's size, on the CPU or an npu. x2: ``(k, n)``,
            on ``x1``'s device.
        symm_tensor, signal: HyperParallel's staging tensor and signal: ``symm_tensor``, when it
            holds ``M x n`` elements of ``x1``'s dtype contiguously on its device, stages the
            product where the call does not pipeline (saving an allocation), else it is not
            used; ``signal`` is not used (symm's collectives stage and signal themselves; see
            the module's docs).
        reduce_op: ``"sum"`` or ``"avg"``.

    Returns:
        A new ``(M / world, n)`` tensor; with grad mode on and ``x1`` or ``x2`` requiring grad it
        carries the backward (an all-gather of ``grad_out``).
    """
    world, _ = _api._group_size_rank(group)
    x1 = _matrix(x1, "x1", group)
    x2 = _matrix(x2, "x2", group, ("x1", x1))
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
    out = torch.empty((x1.shape[0] // world, x2.shape[1]), dtype=x1.dtype, device=x1.device)
    _matmul_reduce_scatter(x1, x2, out, reduce_op, block_size, group, symm_tensor)
    return out


# --------------------------------------------------------------------------------------------
# PyTorch's operators (torch.ops.symm_mem), on CPU and npu tensors
# --------------------------------------------------------------------------------------------


def _group_of(group_name: str) -> Any:
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(group_name)


def _torch_all_gather_matmul(
    A: torch.Tensor, Bs: Sequence[torch.Tensor], gather_dim: int, group_name: str, return_A: bool = True
) -> Tuple[Optional[torch.Tensor], List[torch.Tensor]]:
    group = _group_of(group_name)
    world, _ = _api._group_size_rank(group)
    for i, B in enumerate(Bs):
        _same_device(B, f"Bs[{i}]", ("A", A), group)
    dim = gather_dim % A.dim()
    shard = A.movedim(dim, 0).contiguous()
    rows = shard.reshape(shard.shape[0], -1)
    gathered = torch.empty((world * rows.shape[0], rows.shape[1]), dtype=A.dtype, device=A.device)
    shmem_allgather(gathered, rows, group=group)
    A_gathered = gathered.view(world * shard.shape[0], *shard.shape[1:]).movedim(0, dim).contiguous()
    outputs = [torch.matmul(A_gathered, B) for B in Bs]
    return (A_gathered if return_A else None), outputs


def _torch_matmul_reduce_scatter(
    A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int, group_name: str
) -> torch.Tensor:
    group = _group_of(group_name)
    world, _ = _api._group_size_rank(group)
    _same_device(B, "B", ("A", A), group)
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
    part = torch.empty((moved.shape[0] // world, *moved.shape[1:]), dtype=A.dtype, device=A.device)
    shmem_reduce_scatter(part.view(part.shape[0], -1), moved.view(moved.shape[0], -1), reduce_op, group=group)
    return part.movedim(0, dim).contiguous()


#: symm's kernel of each of PyTorch's operators.
_KERNELS: Dict[str, Callable[..., Any]] = {
    "fused_all_gather_matmul": _torch_all_gather_matmul,
    "fused_matmul_reduce_scatter": _torch_matmul_reduce_scatter,
}

#: The ``(operator, dispatch key)`` pairs given symm's kernel so far.
_registered: Set[Tuple[str, str]] = set()


def _kernels_to_register(
    backend: str, has_kernel: Callable[[str, str], bool], registered: Set[Tuple[str, str]]
) -> List[Tuple[str, str]]:
    """The ``(operator, dispatch key)`` pairs to give symm's kernel, those of ``registered``
    left out: every operator on ``CPU``; on ``PrivateUse1`` where that key is torch_npu's
    (``backend``, the privateuse1 backend's name, is ``npu``) and torch_npu has no kernel of its
    own for the operator (``has_kernel(qualified name, key)``; where it has one, that one is
    kept)."""
    keys = ["CPU"] + (["PrivateUse1"] if backend == "npu" else [])
    return [
        (op, key)
        for key in keys
        for op in _KERNELS
        if (op, key) not in registered and (key == "CPU" or not has_kernel(f"symm_mem::{op}", key))
    ]


def register_torch_ops() -> None:
    """Gives PyTorch's ``symm_mem`` fused operators symm's kernels, each once: on CPU tensors,
    and on npu tensors where torch_npu is loaded and gives them none (``import symm`` calls it;
    call it again where torch_npu is imported after symm)."""
    import torch.distributed._symmetric_memory  # noqa: F401 - defines the symm_mem schemas

    backend = torch._C._get_privateuse1_backend_name()
    todo = _kernels_to_register(backend, torch._C._dispatch_has_kernel_for_dispatch_key, _registered)
    if not todo:
        return
    lib = globals().get("_library")
    if lib is None:
        lib = torch.library.Library("symm_mem", "IMPL")
        # Kept alive with the module: dropping a Library deregisters its kernels.
        globals()["_library"] = lib
    for op, key in todo:
        lib.impl(op, _KERNELS[op], key)
        _registered.add((op, key))
