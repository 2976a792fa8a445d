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


def differentiable_op(op: Any, group: Any) -> str:
    """``op`` as ``"sum"`` or ``"avg"`` (the reductions with a gradient); otherwise rejects the
    collective's round (so the peers fail at once) and raises InvalidArgument naming ``op``."""
    key = op.strip().lower() if isinstance(op, str) else op
    try:
        name = _DIFFERENTIABLE_OPS.get(key)
    except TypeError:  # unhashable
        name = None
    if name is None or isinstance(op, bool):
        raise _api._rejected(
            group,
            "op",
            repr(op),
            "the differentiable collectives take 'sum' (0) or 'avg' (1); max and min have no gradient here "
            "(use symm.shmem_allreduce / shmem_reduce_scatter)",
        )
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
