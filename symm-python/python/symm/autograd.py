"""The collectives as ``torch.autograd.Function``s (PyTorch only; use ``symm.functional``).

Each Function's forward runs a ``symm.shmem_*`` collective on fresh output tensors (the
input is never modified); its backward runs the dual collective on the gradient. The group is
an argument of ``apply`` and travels in ``ctx``, so one Function serves every group. Backward
collectives are collectives like any other: every member of the group must run the backward of
the same Functions in the same order (autograd does when the ranks build the same graph).

Gradient conventions (see the README, "Autograd"):

=================  ==============================  ============================================
Function           forward                         backward
=================  ==============================  ============================================
AllGather          concatenate the inputs, dim 0   reduce_scatter(sum) of the gradient
ReduceScatter      reduce part r into rank r       all_gather of the gradient (avg: then / n)
AllReduce          reduce (sum, avg)               ``"identity"`` (default): the gradient as is
                                                   (avg: / n); ``"all_reduce"``: all_reduce of
                                                   the gradient with the same op
AllToAll           exchange rows by split sizes    all_to_all of the gradient, splits swapped
Broadcast          rank src's input everywhere     sum of the gradients, to src (others: 0)
Send               send to dst; output = input     gradient of the output + the gradient that
                   (after a flag: grad or not)     dst's Recv sends back
Recv               receive from src                send the gradient back to src
SendRecv           send to dst, receive from src   the gradient to src, the input's from dst
                   (after a flag each way)         (each only where the flags say)
=================  ==============================  ============================================

Two conventions meet here, and the difference matters only for outputs that are *replicated*
(the same value on every rank: all_gather, all_reduce, broadcast):

- **sum over ranks** (all_gather, broadcast, ``all_reduce(backward="all_reduce")``, and
  PyTorch's functional collectives): every rank's loss is a separate term of the total loss
  ``L = sum_r L_r``; a replica's gradient is one term, and the backward sums the terms.
- **replicated** (``all_reduce``'s default, the RFC and Megatron-LM's convention): the code
  after the all_reduce is itself replicated (the same computation on every rank, e.g. the rest
  of a tensor-parallel block), so each rank's incoming gradient is *already* the full gradient
  of the one loss: the backward passes it through (a sum's derivative is 1) with no
  communication. Summing it again would multiply it by the group size.

Outputs that differ per rank (reduce_scatter, all_to_all, recv) have one correct gradient.

The RFC's own calls (``symm.shmem_allreduce`` ... ``shmem_sendrecv``) record their backward
through the ``Shmem*`` Functions at the end of this module whenever grad mode is on and one of
their tensors requires grad: the native entry hands such calls to ``_record``.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar

import torch
from torch.autograd.function import once_differentiable

from . import _api

__all__ = ["AllGather", "ReduceScatter", "AllReduce", "AllToAll", "Broadcast", "Send", "Recv", "SendRecv"]

_DIFFERENTIABLE_OPS = {"sum": "sum", "avg": "avg", 0: "sum", 1: "avg"}


_F = TypeVar("_F", bound=Callable[..., Any])


def _traced(name: str, tensor_arg: str, group_arg: Optional[str] = None) -> Callable[[_F], _F]:
    """A profiler range ``symm::<Function>.<forward|backward>(<numel> x <dtype>, group=...)``
    around a forward or backward (group from the argument ``group_arg``, else ``ctx.group``)."""

    def describe(st: Any, a: Dict[str, Any]) -> str:
        group = a[group_arg] if group_arg is not None else getattr(a["ctx"], "group", None)
        return f"{_api._size(st, a[tensor_arg])}, {_api._group_text(st, group)}"

    return _api._profiled(name, describe)


def _recv_text(st: Any, a: Dict[str, Any]) -> str:
    shape = tuple(a["shape"]) if isinstance(a["shape"], (list, tuple)) else (a["shape"],)
    numel = math.prod(int(d) for d in shape)
    return f"{numel} x {str(a['dtype']).rpartition('.')[2]}, {_api._group_text(st, a['group'])}"


_NO_GRADIENT = (
    "the differentiable collectives take 'sum' (0) or 'avg' (1); max and min have no gradient here "
    "(use symm.shmem_allreduce / shmem_reduce_scatter)"
)


def differentiable_op(op: Any, group: Any, reason: str = _NO_GRADIENT) -> str:
    """``op`` as ``"sum"`` or ``"avg"`` (the reductions with a gradient); otherwise rejects the
    collective's round (so the peers fail at once) and raises InvalidArgument naming ``op``
    (``reason``: why)."""
    key = op.strip().lower() if isinstance(op, str) else op
    try:
        name = _DIFFERENTIABLE_OPS.get(key)
    except TypeError:  # unhashable
        name = None
    if name is None or isinstance(op, bool):
        raise _api._rejected(group, "op", repr(op), reason)
    return name


def _dim0(t: torch.Tensor) -> Tuple[int, Tuple[int, ...]]:
    """Rows and the shape of one row (a 0-d tensor is one row of shape ())."""
    if t.dim() == 0:
        return 1, ()
    return t.shape[0], tuple(t.shape[1:])


def _all_gather(x: torch.Tensor, group: Any) -> torch.Tensor:
    n, _ = _api._group_size_rank(group)
    x = x.contiguous()
    rows, row = _dim0(x)
    out = torch.empty((n * rows,) + row, dtype=x.dtype)
    _api.shmem_allgather(out, x, group)
    return out


def _reduce_scatter(x: torch.Tensor, op: str, group: Any, shape: Tuple[int, ...], lp: Any = None) -> torch.Tensor:
    out = torch.empty(shape, dtype=x.dtype)
    _api.shmem_reduce_scatter(out, x.contiguous(), op, group, lp)
    return out


def _all_to_all(x: torch.Tensor, out_splits: List[int], in_splits: List[int], group: Any) -> torch.Tensor:
    x = x.contiguous()
    _, row = _dim0(x)
    per_row = math.prod(row)
    out = torch.empty((sum(out_splits),) + row, dtype=x.dtype)
    sends, at = [], 0
    for s in in_splits:
        sends.append(x[at : at + s])
        at += s
    _api.shmem_alltoall(sends, out, [s * per_row for s in out_splits], group)
    return out


class AllGather(torch.autograd.Function):
    """``AllGather.apply(input, group)``: the group's inputs concatenated along dim 0 (a 0-d
    input gives shape ``(n,)``). Backward: reduce_scatter(sum) of the gradient."""

    @staticmethod
    @_traced("AllGather.forward", "input", "group")
    def forward(ctx: Any, input: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        ctx.shape = tuple(input.shape)
        return _all_gather(input, group)

    @staticmethod
    @once_differentiable
    @_traced("AllGather.backward", "grad")
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], None]:
        return _reduce_scatter(grad, "sum", ctx.group, ctx.shape), None


class ReduceScatter(torch.autograd.Function):
    """``ReduceScatter.apply(input, op, group, low_precision_dtype)``: ``input``'s dim 0 split
    into n equal parts; rank r gets the reduction (``"sum"``/``"avg"``) of part r. Backward:
    all_gather of the gradient (divided by n for avg)."""

    @staticmethod
    @_traced("ReduceScatter.forward", "input", "group")
    def forward(ctx: Any, input: torch.Tensor, op: str, group: Any, low_precision_dtype: Any = None) -> torch.Tensor:
        n, _ = _api._group_size_rank(group)
        rows, row = _dim0(input)
        if input.dim() == 0 or rows % n:
            raise _api._rejected(
                group,
                "input",
                f"tensor of shape {tuple(input.shape)}",
                f"dim 0 must split into group size {n} equal parts",
            )
        ctx.group, ctx.op, ctx.n = group, op, n
        return _reduce_scatter(input, op, group, (rows // n,) + row, low_precision_dtype)

    @staticmethod
    @once_differentiable
    @_traced("ReduceScatter.backward", "grad")
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], None, None, None]:
        g = _all_gather(grad, ctx.group)
        if ctx.op == "avg":
            g.div_(ctx.n)
        return g, None, None, None


class AllReduce(torch.autograd.Function):
    """``AllReduce.apply(input, op, group, backward, low_precision_dtype)``: the reduction
    (``"sum"``/``"avg"``) of the group's inputs, on every rank. ``backward``: ``"identity"``
    (the replicated convention, default of ``symm.functional.all_reduce``) or
    ``"all_reduce"`` (the sum-over-ranks convention)."""

    @staticmethod
    @_traced("AllReduce.forward", "input", "group")
    def forward(
        ctx: Any, input: torch.Tensor, op: str, group: Any, backward: str, low_precision_dtype: Any = None
    ) -> torch.Tensor:
        n, _ = _api._group_size_rank(group)
        ctx.group, ctx.op, ctx.n, ctx.mode = group, op, n, backward
        out = input.contiguous().clone()
        _api.shmem_allreduce(out, op, group, low_precision_dtype)
        return out

    @staticmethod
    @once_differentiable
    @_traced("AllReduce.backward", "grad")
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], None, None, None, None]:
        if ctx.mode == "identity":
            g = grad if ctx.op == "sum" else grad / ctx.n
        else:
            g = grad.contiguous().clone()
            _api.shmem_allreduce(g, ctx.op, ctx.group)
        return g, None, None, None, None


class AllToAll(torch.autograd.Function):
    """``AllToAll.apply(input, output_split_sizes, input_split_sizes, group)`` (split sizes
    given, in rows of dim 0): rows ``input_split_sizes[i]`` go to rank i; what rank i sends
    arrives as ``output_split_sizes[i]`` rows, in rank order. Backward: the same exchange of
    the gradient with the splits swapped."""

    @staticmethod
    @_traced("AllToAll.forward", "input", "group")
    def forward(
        ctx: Any, input: torch.Tensor, output_split_sizes: List[int], input_split_sizes: List[int], group: Any
    ) -> torch.Tensor:
        ctx.group, ctx.out_splits, ctx.in_splits = group, list(output_split_sizes), list(input_split_sizes)
        return _all_to_all(input, ctx.out_splits, ctx.in_splits, group)

    @staticmethod
    @once_differentiable
    @_traced("AllToAll.backward", "grad")
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], None, None, None]:
        return _all_to_all(grad, ctx.in_splits, ctx.out_splits, ctx.group), None, None, None


class Broadcast(torch.autograd.Function):
    """``Broadcast.apply(input, src, group)``: group rank ``src``'s input on every rank.
    Backward: the sum of every rank's gradient goes to ``src``; the others get zeros."""

    @staticmethod
    @_traced("Broadcast.forward", "input", "group")
    def forward(ctx: Any, input: torch.Tensor, src: int, group: Any) -> torch.Tensor:
        _, me = _api._group_size_rank(group)
        ctx.group, ctx.is_src = group, me == src
        out = input.contiguous().clone()
        _api.shmem_broadcast(out, src, group)
        return out

    @staticmethod
    @once_differentiable
    @_traced("Broadcast.backward", "grad")
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], None, None]:
        g = grad.contiguous().clone()
        _api.shmem_allreduce(g, "sum", ctx.group)
        return (g if ctx.is_src else torch.zeros_like(g)), None, None


def _grad_flag(wants: bool) -> torch.Tensor:
    return torch.tensor([1 if wants else 0], dtype=torch.int8)


def recv_grad_flag(src: int, group: Any) -> bool:
    """Receives the message ``Send`` puts before its data: whether the sender's backward will
    wait for the gradient."""
    flag = torch.empty(1, dtype=torch.int8)
    _api.shmem_recv(flag, src, group)
    return bool(flag.item())


class Send(torch.autograd.Function):
    """``Send.apply(input, dst, group)``: sends ``input`` to group rank ``dst`` and returns it
    (a new tensor with the same values, for local use). Before the data goes a one-byte message
    saying whether this backward will wait for a gradient (``input`` requires grad, grad mode
    on), which ``symm.functional.recv`` reads to decide whether its result requires grad.
    Backward: receives from ``dst`` the gradient its Recv sends back and adds it to the
    gradient of the returned tensor (zeros when the returned tensor is used only to reach the
    backward)."""

    @staticmethod
    @_traced("Send.forward", "input", "group")
    def forward(ctx: Any, input: torch.Tensor, dst: int, group: Any) -> torch.Tensor:
        ctx.group, ctx.dst = group, dst
        x = input.contiguous()
        _api.shmem_send(_grad_flag(bool(ctx.needs_input_grad[0])), dst, group)
        _api.shmem_send(x, dst, group)
        ctx.shape, ctx.dtype = tuple(x.shape), x.dtype
        return x.clone()

    @staticmethod
    @once_differentiable
    @_traced("Send.backward", "grad")
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], None, None]:
        remote = torch.empty(ctx.shape, dtype=ctx.dtype)
        _api.shmem_recv(remote, ctx.dst, ctx.group)
        return grad + remote, None, None


class Recv(torch.autograd.Function):
    """``Recv.apply(anchor, shape, dtype, src, group)``: a tensor of ``shape`` and ``dtype``
    received from group rank ``src``. ``anchor`` is any tensor that requires grad; it only
    makes the output require grad and places the node in a graph (its gradient is None).
    Backward: sends the gradient back to ``src`` (whose Send's backward receives it)."""

    @staticmethod
    @_api._profiled("Recv.forward", _recv_text)
    def forward(
        ctx: Any, anchor: torch.Tensor, shape: Tuple[int, ...], dtype: torch.dtype, src: int, group: Any
    ) -> torch.Tensor:
        ctx.group, ctx.src = group, src
        out = torch.empty(shape, dtype=dtype)
        _api.shmem_recv(out, src, group)
        return out

    @staticmethod
    @once_differentiable
    @_traced("Recv.backward", "grad")
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[None, None, None, None, None]:
        _api.shmem_send(grad.contiguous(), ctx.src, ctx.group)
        return None, None, None, None, None


def exchange_grad_flags(wants: bool, dst: int, src: int, group: Any) -> bool:
    """The message ``functional.sendrecv`` puts before its data, both ways at once: tells ``dst``
    whether this rank's backward will wait for the gradient of its input, and returns whether
    ``src``'s will (so this rank must send it the gradient of what it received)."""
    theirs = torch.empty(1, dtype=torch.int8)
    _api.shmem_sendrecv(_grad_flag(wants), dst, theirs, src, group)
    return bool(theirs.item())


class SendRecv(torch.autograd.Function):
    """``SendRecv.apply(anchor, input, dst, shape, dtype, src, group, grad_from_dst, grad_to_src)``:
    sends ``input`` to group rank ``dst`` and returns a tensor of ``shape`` and ``dtype``
    received from group rank ``src``, both at once. ``anchor`` only makes the output require
    grad when ``input`` does not (as in ``Recv``); the two flags are what
    ``exchange_grad_flags`` settled: whether ``dst`` sends back the gradient of ``input``, and
    whether ``src`` waits for the gradient of the output. Backward: the transposed exchange,
    each direction only where the flags say, both at once when both do."""

    @staticmethod
    @_traced("SendRecv.forward", "input", "group")
    def forward(
        ctx: Any,
        anchor: torch.Tensor,
        input: torch.Tensor,
        dst: int,
        shape: Tuple[int, ...],
        dtype: torch.dtype,
        src: int,
        group: Any,
        grad_from_dst: bool,
        grad_to_src: bool,
    ) -> torch.Tensor:
        x = input.contiguous()
        ctx.group, ctx.dst, ctx.src, ctx.shape, ctx.dtype = group, dst, src, tuple(x.shape), x.dtype
        ctx.grad_from_dst, ctx.grad_to_src = grad_from_dst, grad_to_src
        out = torch.empty(shape, dtype=dtype)
        _api.shmem_sendrecv(x, dst, out, src, group)
        return out

    @staticmethod
    @once_differentiable
    @_traced("SendRecv.backward", "grad")
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        back = torch.empty(ctx.shape, dtype=ctx.dtype) if ctx.grad_from_dst else None
        g = grad.contiguous()
        if ctx.grad_to_src and back is not None:
            _api.shmem_sendrecv(g, ctx.src, back, ctx.dst, ctx.group)
        elif ctx.grad_to_src:
            _api.shmem_send(g, ctx.src, ctx.group)
        elif back is not None:
            _api.shmem_recv(back, ctx.dst, ctx.group)
        return (None, back) + (None,) * 7


# --------------------------------------------------------------------------------------------
# The RFC's own calls (``symm.shmem_*``) with a tensor that requires grad in grad mode: the
# native entry hands them to ``_record``, which runs them through the Functions below. Each
# forward makes the same call (grad mode is off there, so it takes the native path), marks
# the tensor written in place as modified (``ctx.mark_dirty``, as torch's in-place operations
# do: it gets the Function as its ``grad_fn``), and each backward runs the dual collective:
#
#   shmem_allgather       <-> reduce_scatter(sum)          shmem_send  <-> recv from dst
#   shmem_reduce_scatter  <-> allgather (avg: / n)         shmem_recv  <-> send to src
#   shmem_allreduce       <-> allreduce, same op           shmem_sendrecv <-> the transposed
#   shmem_alltoall        <-> alltoall, counts swapped         sendrecv
#   shmem_broadcast       <-> reduce to src (others: 0)
#
# shmem_allreduce's backward is the sum-over-ranks convention (each rank's loss is one term;
# see the module docstring); ``symm.functional.all_reduce`` also offers the replicated one.
# The async form (``async_op=True``) records the same way and returns the work; the tensor is
# marked modified at once, and belongs to the operation until ``wait()``.
# --------------------------------------------------------------------------------------------


def _grad_op(op: Any, group: Any) -> str:
    """``op`` as ``"sum"`` or ``"avg"``; otherwise rejects the round and raises InvalidArgument."""
    return differentiable_op(
        op,
        group,
        "an input requires grad, and only 'sum' (0) and 'avg' (1) have a gradient here; for max or min "
        "pass tensors that do not require grad (detach()) or call under torch.no_grad()",
    )


def _grad_leaf(t: Any) -> bool:
    """A leaf that requires grad (a parameter), or a view of one: autograd cannot record a write
    into it."""
    if not isinstance(t, torch.Tensor) or not t.requires_grad:
        return False
    base = t._base if t._is_view() and t._base is not None else t
    return base.is_leaf and base.requires_grad


def _requires_grad(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_requires_grad(v) for v in value)
    return isinstance(value, torch.Tensor) and value.requires_grad


#: Per call: the argument it writes, and those it only reads.
_WRITES: Dict[str, Tuple[Optional[str], Tuple[str, ...]]] = {
    "shmem_allreduce": ("tensor", ()),
    "shmem_reduce_scatter": ("output_tensor", ("input_tensor",)),
    "shmem_allgather": ("output_tensor", ("input_tensor",)),
    "shmem_alltoall": ("receive_tensor", ("send_tensor_list",)),
    "shmem_broadcast": ("tensor", ()),
    "shmem_send": (None, ("tensor",)),
    "shmem_recv": ("tensor", ()),
    "shmem_sendrecv": ("recv_tensor", ("send_tensor",)),
}


def _rank_int(value: Any) -> Optional[int]:
    """A rank given as an int or a one-element integer tensor; None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        return int(value.item())
    return None


def _count_ints(value: Any) -> Optional[List[int]]:
    """alltoall's ``receive_list`` as ints; None when it is not a sequence of counts."""
    if isinstance(value, torch.Tensor) and (value.is_floating_point() or value.is_complex()):
        return None
    try:
        items = value.reshape(-1).tolist() if isinstance(value, torch.Tensor) else [_rank_int(v) for v in value]
        out = [int(v) for v in items]
    except (TypeError, ValueError, RuntimeError):
        return None
    return out if all(v >= 0 for v in out) else None


class ShmemAllReduce(torch.autograd.Function):
    """``symm.shmem_allreduce(tensor, op)`` with autograd: ``tensor`` is reduced in place (and
    marked modified). Backward: identity, the RFC's convention (its duality table: the result
    is replicated, and so is its gradient; Megatron's): the gradient itself for sum, divided by
    the group's size for avg. ``symm.functional.all_reduce(..., backward="all_reduce")`` has the
    sum-over-ranks convention."""

    @staticmethod
    @_traced("ShmemAllReduce.forward", "tensor", "group")
    def forward(ctx: Any, tensor: torch.Tensor, op: str, group: Any, lp: Any, async_op: bool, box: list) -> Any:
        ctx.op = op
        ctx.n, _ = _api._group_size_rank(group)
        box.append(_api.shmem_allreduce(tensor, op, group, lp, async_op))
        ctx.mark_dirty(tensor)
        return tensor

    @staticmethod
    @once_differentiable
    @_traced("ShmemAllReduce.backward", "grad")
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        g = grad if ctx.op == "sum" else grad / ctx.n
        return (g,) + (None,) * 5


class ShmemReduceScatter(torch.autograd.Function):
    """``symm.shmem_reduce_scatter(output, input, op)`` with autograd: ``output`` is written (and
    marked modified). Backward: the gradient of ``input`` is the allgather of ``output``'s
    (divided by n for avg); the old ``output`` gets none (it is overwritten)."""

    @staticmethod
    @_traced("ShmemReduceScatter.forward", "input", "group")
    def forward(
        ctx: Any, output: torch.Tensor, input: torch.Tensor, op: str, group: Any, lp: Any, async_op: bool, box: list
    ) -> Any:
        ctx.group, ctx.op, ctx.shape = group, op, tuple(input.shape)
        ctx.n, _ = _api._group_size_rank(group)
        box.append(_api.shmem_reduce_scatter(output, input, op, group, lp, async_op))
        ctx.mark_dirty(output)
        return output

    @staticmethod
    @once_differentiable
    @_traced("ShmemReduceScatter.backward", "grad")
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        g = torch.empty(ctx.shape, dtype=grad.dtype)
        _api.shmem_allgather(g, grad.contiguous(), ctx.group)
        if ctx.op == "avg":
            g.div_(ctx.n)
        return (None, g) + (None,) * 5


class ShmemAllGather(torch.autograd.Function):
    """``symm.shmem_allgather(output, input)`` with autograd: ``output`` is written (and marked
    modified). Backward: the gradient of ``input`` is the reduce_scatter(sum) of ``output``'s."""

    @staticmethod
    @_traced("ShmemAllGather.forward", "input", "group")
    def forward(ctx: Any, output: torch.Tensor, input: torch.Tensor, group: Any, async_op: bool, box: list) -> Any:
        ctx.group, ctx.shape = group, tuple(input.shape)
        box.append(_api.shmem_allgather(output, input, group, async_op))
        ctx.mark_dirty(output)
        return output

    @staticmethod
    @once_differentiable
    @_traced("ShmemAllGather.backward", "grad")
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        g = torch.empty(ctx.shape, dtype=grad.dtype)
        _api.shmem_reduce_scatter(g, grad.contiguous(), "sum", ctx.group)
        return (None, g) + (None,) * 3


class ShmemAllToAll(torch.autograd.Function):
    """``symm.shmem_alltoall(sends, receive, counts)`` with autograd (``apply(receive, counts,
    group, async_op, box, *sends)``): ``receive`` is written (and marked modified). Backward:
    what came from rank i goes back to it (the alltoall of the gradient with the counts
    swapped); the elements of ``receive`` past ``sum(counts)``, left as they were, pass their
    gradient through."""

    @staticmethod
    @_traced("ShmemAllToAll.forward", "receive", "group")
    def forward(
        ctx: Any, receive: torch.Tensor, counts: List[int], group: Any, async_op: bool, box: list, *sends: torch.Tensor
    ) -> Any:
        ctx.group, ctx.counts = group, list(counts)
        ctx.sends = [(tuple(s.shape), s.numel()) for s in sends]
        box.append(_api.shmem_alltoall(list(sends), receive, list(counts), group, async_op))
        ctx.mark_dirty(receive)
        return receive

    @staticmethod
    @once_differentiable
    @_traced("ShmemAllToAll.backward", "grad")
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        flat = grad.contiguous().view(-1)
        parts, at = [], 0
        for c in ctx.counts:
            parts.append(flat[at : at + c])
            at += c
        sizes = [numel for _, numel in ctx.sends]
        back = torch.empty(sum(sizes), dtype=grad.dtype)
        _api.shmem_alltoall(parts, back, sizes, ctx.group)
        grads, start = [], 0
        for shape, numel in ctx.sends:
            grads.append(back[start : start + numel].view(shape))
            start += numel
        rest = None
        if at < flat.numel():
            rest = flat.clone()
            rest[:at] = 0
            rest = rest.view(grad.shape)
        return (rest, None, None, None, None, *grads)


class ShmemBroadcast(torch.autograd.Function):
    """``symm.shmem_broadcast(tensor, src)`` with autograd: ``tensor`` is written (and marked
    modified). Backward: ``src`` gets the sum of every rank's gradient (a reduce to the root),
    the others none (their tensor was overwritten)."""

    @staticmethod
    @_traced("ShmemBroadcast.forward", "tensor", "group")
    def forward(ctx: Any, tensor: torch.Tensor, src: int, group: Any, async_op: bool, box: list) -> Any:
        _, me = _api._group_size_rank(group)
        ctx.group, ctx.is_src = group, me == src
        box.append(_api.shmem_broadcast(tensor, src, group, async_op))
        ctx.mark_dirty(tensor)
        return tensor

    @staticmethod
    @once_differentiable
    @_traced("ShmemBroadcast.backward", "grad")
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        g = grad.contiguous().clone()
        _api.shmem_allreduce(g, "sum", ctx.group)
        return (g if ctx.is_src else torch.zeros_like(g)), None, None, None, None


class ShmemSend(torch.autograd.Function):
    """``symm.shmem_send(tensor, dst)`` with autograd: returns ``tensor`` (an alias, the way to
    this backward). Backward: the alias's gradient plus the gradient ``dst``'s
    ``shmem_recv`` sends back."""

    @staticmethod
    @_traced("ShmemSend.forward", "tensor", "group")
    def forward(ctx: Any, tensor: torch.Tensor, dst: int, group: Any) -> Any:
        ctx.group, ctx.dst, ctx.shape, ctx.dtype = group, dst, tuple(tensor.shape), tensor.dtype
        _api.shmem_send(tensor, dst, group)
        return tensor

    @staticmethod
    @once_differentiable
    @_traced("ShmemSend.backward", "grad")
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], None, None]:
        remote = torch.empty(ctx.shape, dtype=ctx.dtype)
        _api.shmem_recv(remote, ctx.dst, ctx.group)
        return grad + remote, None, None


class ShmemRecv(torch.autograd.Function):
    """``symm.shmem_recv(tensor, src)`` with autograd: ``tensor`` is written (and marked
    modified). Backward: sends its gradient back to ``src`` (whose ``shmem_send`` backward
    receives it); the old ``tensor`` gets none."""

    @staticmethod
    @_traced("ShmemRecv.forward", "tensor", "group")
    def forward(ctx: Any, tensor: torch.Tensor, src: int, group: Any, async_op: bool, box: list) -> Any:
        ctx.group, ctx.src = group, src
        box.append(_api.shmem_recv(tensor, src, group, async_op))
        ctx.mark_dirty(tensor)
        return tensor

    @staticmethod
    @once_differentiable
    @_traced("ShmemRecv.backward", "grad")
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[None, ...]:
        _api.shmem_send(grad.contiguous(), ctx.src, ctx.group)
        return None, None, None, None, None


class ShmemSendRecv(torch.autograd.Function):
    """``symm.shmem_sendrecv(send, dst, recv, src)`` with autograd: ``recv`` is written (and
    marked modified). Backward: the transposed exchange, both ways at once: ``recv``'s gradient
    goes back to ``src``, ``send``'s comes from ``dst``."""

    @staticmethod
    @_traced("ShmemSendRecv.forward", "send", "group")
    def forward(
        ctx: Any, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int, group: Any, async_op: bool, box: list
    ) -> Any:
        ctx.group, ctx.dst, ctx.src, ctx.shape, ctx.dtype = group, dst, src, tuple(send.shape), send.dtype
        box.append(_api.shmem_sendrecv(send, dst, recv, src, group, async_op))
        ctx.mark_dirty(recv)
        return recv

    @staticmethod
    @once_differentiable
    @_traced("ShmemSendRecv.backward", "grad")
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        back = torch.empty(ctx.shape, dtype=ctx.dtype)
        _api.shmem_sendrecv(grad.contiguous(), ctx.src, back, ctx.dst, ctx.group)
        return back, None, None, None, None, None, None


def _plain(function: str, given: Dict[str, Any]) -> Any:
    """The call as given, without recording (arguments ``_record`` cannot read: the native call
    reports them, rejecting the round as usual)."""
    with torch.no_grad():
        return getattr(_api, function)(**given)


def _record_allreduce(
    tensor: Any, op: Any = "sum", group: Any = None, low_precision_dtype: Any = None, async_op: Any = False
) -> Any:
    name = _grad_op(op, group)
    box: list = []
    ShmemAllReduce.apply(tensor, name, group, low_precision_dtype, bool(async_op), box)
    return box[0]


def _record_reduce_scatter(
    output_tensor: Any,
    input_tensor: Any,
    op: Any = "sum",
    group: Any = None,
    low_precision_dtype: Any = None,
    async_op: Any = False,
) -> Any:
    name = _grad_op(op, group)
    if not isinstance(output_tensor, torch.Tensor) or not isinstance(input_tensor, torch.Tensor):
        given = dict(output_tensor=output_tensor, input_tensor=input_tensor, op=op, group=group)
        return _plain("shmem_reduce_scatter", dict(given, low_precision_dtype=low_precision_dtype, async_op=async_op))
    box: list = []
    ShmemReduceScatter.apply(output_tensor, input_tensor, name, group, low_precision_dtype, bool(async_op), box)
    return box[0]


def _record_allgather(output_tensor: Any, input_tensor: Any, group: Any = None, async_op: Any = False) -> Any:
    if not isinstance(output_tensor, torch.Tensor) or not isinstance(input_tensor, torch.Tensor):
        given = dict(output_tensor=output_tensor, input_tensor=input_tensor, group=group, async_op=async_op)
        return _plain("shmem_allgather", given)
    box: list = []
    ShmemAllGather.apply(output_tensor, input_tensor, group, bool(async_op), box)
    return box[0]


def _record_alltoall(
    send_tensor_list: Any, receive_tensor: Any, receive_list: Any, group: Any = None, async_op: Any = False
) -> Any:
    counts = _count_ints(receive_list)
    sends = list(send_tensor_list) if isinstance(send_tensor_list, (list, tuple)) else None
    if (
        counts is None
        or sends is None
        or not isinstance(receive_tensor, torch.Tensor)
        or not all(isinstance(s, torch.Tensor) for s in sends)
    ):
        given = dict(send_tensor_list=send_tensor_list, receive_tensor=receive_tensor, receive_list=receive_list)
        return _plain("shmem_alltoall", dict(given, group=group, async_op=async_op))
    box: list = []
    ShmemAllToAll.apply(receive_tensor, counts, group, bool(async_op), box, *sends)
    return box[0]


def _record_broadcast(tensor: Any, src_rank: Any, group: Any = None, async_op: Any = False) -> Any:
    src = _rank_int(src_rank)
    if src is None or not isinstance(tensor, torch.Tensor):
        return _plain("shmem_broadcast", dict(tensor=tensor, src_rank=src_rank, group=group, async_op=async_op))
    box: list = []
    ShmemBroadcast.apply(tensor, src, group, bool(async_op), box)
    return box[0]


def _record_send(tensor: Any, dst_rank: Any, group: Any = None, async_op: Any = False) -> Any:
    dst = _rank_int(dst_rank)
    if async_op:
        raise _api._invalid_argument(
            "async_op",
            repr(async_op),
            "tensor requires grad, so shmem_send records its backward and returns the tensor's alias through "
            "which autograd reaches it; that form is blocking (call with async_op=False, or send tensor.detach())",
        )
    if dst is None:
        return _plain("shmem_send", dict(tensor=tensor, dst_rank=dst_rank, group=group))
    return ShmemSend.apply(tensor, dst, group)


def _record_recv(tensor: Any, src_rank: Any, group: Any = None, async_op: Any = False) -> Any:
    src = _rank_int(src_rank)
    if src is None:
        return _plain("shmem_recv", dict(tensor=tensor, src_rank=src_rank, group=group, async_op=async_op))
    box: list = []
    ShmemRecv.apply(tensor, src, group, bool(async_op), box)
    return box[0]


def _record_sendrecv(
    send_tensor: Any, dst_rank: Any, recv_tensor: Any, src_rank: Any, group: Any = None, async_op: Any = False
) -> Any:
    dst, src = _rank_int(dst_rank), _rank_int(src_rank)
    if (
        dst is None
        or src is None
        or not isinstance(send_tensor, torch.Tensor)
        or not isinstance(recv_tensor, torch.Tensor)
    ):
        given = dict(send_tensor=send_tensor, dst_rank=dst_rank, recv_tensor=recv_tensor, src_rank=src_rank)
        return _plain("shmem_sendrecv", dict(given, group=group, async_op=async_op))
    box: list = []
    ShmemSendRecv.apply(send_tensor, dst, recv_tensor, src, group, bool(async_op), box)
    return box[0]


_RECORDERS: Dict[str, Callable[..., Any]] = {
    "shmem_allreduce": _record_allreduce,
    "shmem_reduce_scatter": _record_reduce_scatter,
    "shmem_allgather": _record_allgather,
    "shmem_alltoall": _record_alltoall,
    "shmem_broadcast": _record_broadcast,
    "shmem_send": _record_send,
    "shmem_recv": _record_recv,
    "shmem_sendrecv": _record_sendrecv,
}


def _record(function: str, given: Dict[str, Any]) -> Any:
    """A ``symm.shmem_*`` call (``given``: its arguments by name) in which grad mode is on and a
    tensor requires grad, recorded for autograd: what the native entry calls for such calls.

    A leaf that requires grad (a parameter), or a view of one, cannot be written by a recorded
    call (torch refuses in-place operations on it). When it is the tensor the call writes and no
    tensor the call only reads requires grad (``shmem_broadcast(param, 0)``,
    ``shmem_allreduce(param)``: there is no gradient to record), the call writes it as
    torch.distributed's collectives do, unrecorded; otherwise the call is refused (the round
    rejected), since the gradient of what it reads would be lost."""
    written, reads = _WRITES[function]
    if written is not None and _grad_leaf(given.get(written)):
        if not any(_requires_grad(given.get(r)) for r in reads):
            return _plain(function, given)
        t = given[written]
        what = "a leaf tensor" if not t._is_view() else "a view of a leaf tensor"
        value = f"{what} of shape {tuple(t.shape)} that requires grad"
        reason = (
            f"autograd cannot record a write into it, and {' and '.join(reads)} requires grad (the call would "
            "record its gradient); write a copy (x.clone()), or call under torch.no_grad() to write it "
            "without recording"
        )
        if function in ("shmem_send", "shmem_recv", "shmem_sendrecv"):
            raise _api._invalid_argument(written, value, reason)
        raise _api._rejected(given.get("group"), written, value, reason)
    return _RECORDERS[function](**given)
