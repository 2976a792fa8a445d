"""Differentiable collectives (PyTorch): out-of-place forms of the ``symm.shmem_*`` calls whose
gradients flow through ``torch.autograd`` (the Functions are in ``symm.autograd``)::

    import symm.functional as F
    y = F.all_gather(x, group=tp)          # (n * x.shape[0], ...); backward: reduce_scatter(sum)
    z = F.reduce_scatter(y, group=tp)      # (y.shape[0] // n, ...); backward: all_gather
    w = F.all_reduce(z, group=dp)          # backward: identity (replicated convention)

Inputs are any CPU tensors (non-contiguous ones are copied first); outputs are new tensors.
Every call is a collective over ``group`` (``None``: every rank symm was initialised for), and
so is its backward: the ranks must run the same differentiable calls in the same order, forward
and backward. ``symm.autograd``'s docstring and the README ("Autograd") give the gradient of
each call and the two conventions for replicated outputs.

Under ``torch.compile`` the collectives (``all_gather``, ``reduce_scatter``, ``all_reduce``,
``all_to_all`` with its split sizes known, ``broadcast``) call symm's torch operators
(``torch.ops.symm.*``, ``symm.library``), which trace with no graph break, with the same
values and gradients. ``send``, ``recv`` and ``sendrecv`` decide at run time whether the
received tensor requires grad (the sender says so), which a graph cannot: they run outside the
graph (a graph break; with ``fullgraph=True``, an error), and so does ``all_to_all``'s exchange
of split sizes when ``output_split_sizes`` is not given.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Union

import torch

from . import _api, library
from .functional import message_shape, split_sizes, tensor_arg
from .autograd import (
    AllGather,
    AllReduce,
    AllToAll,
    Broadcast,
    Recv,
    ReduceScatter,
    Send,
    SendRecv,
    differentiable_op,
    exchange_grad_flags,
    recv_grad_flag,
)

__all__ = ["all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast", "send", "recv", "sendrecv"]


def _tensor(x: Any, arg: str, group: Any, collective: bool = True) -> torch.Tensor:
    return tensor_arg(x, arg, group, torch.Tensor, collective)


def all_gather(input: torch.Tensor, group: Any = None) -> torch.Tensor:
    """The group's ``input`` tensors concatenated along dim 0, in group-rank order: shape
    ``(n * input.shape[0], *input.shape[1:])`` (``(n,)`` for a 0-d input). Every rank passes
    the same shape.

    Gradient: reduce_scatter(sum) of the output's gradient (each rank's loss is a separate term
    of the total; see ``symm.autograd``).
    """
    x = _tensor(input, "input", group)
    if torch.compiler.is_compiling():
        return torch.ops.symm.all_gather(x, library.group_name(group))
    return AllGather.apply(x, group)


def reduce_scatter(
    input: torch.Tensor, op: Union[str, int] = "sum", group: Any = None, low_precision_dtype: Any = None
) -> torch.Tensor:
    """``input``'s dim 0 split into n equal parts; group rank r gets the reduction of part r
    over the group: shape ``(input.shape[0] // n, *input.shape[1:])``.

    ``op``: ``"sum"`` or ``"avg"`` (0 or 1). ``low_precision_dtype`` as in
    ``symm.shmem_reduce_scatter`` (forward only). Gradient: all_gather of the output's gradient
    (divided by n for avg).
    """
    x = _tensor(input, "input", group)
    if torch.compiler.is_compiling():
        name = library._differentiable(op, group)
        return torch.ops.symm.reduce_scatter(x, name, library.group_name(group), library._lp_name(low_precision_dtype))
    return ReduceScatter.apply(x, differentiable_op(op, group), group, low_precision_dtype)


def all_reduce(
    input: torch.Tensor,
    op: Union[str, int] = "sum",
    group: Any = None,
    backward: str = "identity",
    low_precision_dtype: Any = None,
) -> torch.Tensor:
    """The reduction (``"sum"`` or ``"avg"``) of the group's ``input``, on every rank.

    ``backward`` chooses the gradient convention (see ``symm.autograd``):

    - ``"identity"`` (default; the RFC's and Megatron-LM's): the code after the all_reduce is
      replicated, so each rank's incoming gradient is already the full gradient; it passes
      through unchanged (divided by n for avg), with no communication.
    - ``"all_reduce"``: each rank's loss is a separate term of the total loss (PyTorch's
      functional collectives); the gradient is all-reduced with the same op.
    """
    x = _tensor(input, "input", group)
    compiling = torch.compiler.is_compiling()
    name = library._differentiable(op, group) if compiling else differentiable_op(op, group)
    if backward not in ("identity", "all_reduce"):
        raise _api._rejected(group, "backward", repr(backward), "accepted: 'identity', 'all_reduce'")
    if compiling:
        lp = library._lp_name(low_precision_dtype)
        return torch.ops.symm.all_reduce(x, name, library.group_name(group), backward, lp)
    return AllReduce.apply(x, name, group, backward, low_precision_dtype)


def _exchange_splits(input_splits: List[int], group: Any) -> List[int]:
    """What every rank sends here (rows), learned from the ranks' ``input_splits``."""
    if torch.compiler.is_compiling():
        # learned at run time: outside the graph (give output_split_sizes to stay in it)
        return library._eagerly(_exchange_splits, input_splits, group)
    n = len(input_splits)
    got = torch.empty(n, dtype=torch.int64)
    _api.shmem_alltoall([torch.tensor([s], dtype=torch.int64) for s in input_splits], got, [1] * n, group)
    return [int(v) for v in got.tolist()]


def all_to_all(
    input: Union[torch.Tensor, Sequence[torch.Tensor]],
    output_split_sizes: Optional[Sequence[int]] = None,
    input_split_sizes: Optional[Sequence[int]] = None,
    group: Any = None,
) -> Union[torch.Tensor, List[torch.Tensor]]:
    """Personalised exchange along dim 0, in two forms.

    - ``all_to_all(tensor, output_split_sizes=None, input_split_sizes=None)``: rows
      ``input_split_sizes[i]`` of ``tensor`` (consecutive) go to group rank i; returns the rows
      received, ``output_split_sizes[i]`` from rank i, in rank order. ``input_split_sizes=None``:
      n equal parts. ``output_split_sizes=None``: equal parts when the input's are, otherwise
      learned from the senders (one extra exchange of the counts).
    - ``all_to_all([t_0, ..., t_{n-1}])``: ``t_i`` goes to group rank i (any number of rows,
      the same row shape and dtype everywhere); returns the list of tensors received, entry i
      from rank i.

    Gradient: the same exchange of the gradient with the splits swapped (what came from rank i
    goes back to it).
    """
    compiling = torch.compiler.is_compiling()
    n, _ = library._size_rank(library.group_name(group)) if compiling else _api._group_size_rank(group)
    if isinstance(input, (list, tuple)):
        if output_split_sizes is not None or input_split_sizes is not None:
            raise _api._rejected(
                group, "output_split_sizes", repr(output_split_sizes), "the list form takes no split sizes"
            )
        tensors = [_tensor(t, "input", group) for t in input]
        if len(tensors) != n or any(t.dim() == 0 for t in tensors):
            raise _api._rejected(
                group,
                "input",
                f"a list of {len(tensors)} tensors",
                f"needs {n} tensors of >= 1 dimension, one per rank",
            )
        in_splits = [t.shape[0] for t in tensors]
        out_splits = _exchange_splits(in_splits, group)
        out = _all_to_all(torch.cat(tensors), out_splits, in_splits, group)
        return list(torch.split(out, out_splits))
    x = _tensor(input, "input", group)
    in_splits, out_splits = split_sizes(
        tuple(x.shape), n, input_split_sizes, output_split_sizes, group, lambda s: _exchange_splits(s, group)
    )
    return _all_to_all(x, out_splits, in_splits, group)


def _all_to_all(x: torch.Tensor, out_splits: List[int], in_splits: List[int], group: Any) -> torch.Tensor:
    if torch.compiler.is_compiling():
        return torch.ops.symm.all_to_all(x, out_splits, in_splits, library.group_name(group))
    return AllToAll.apply(x, out_splits, in_splits, group)


def broadcast(input: torch.Tensor, src: int, group: Any = None) -> torch.Tensor:
    """Group rank ``src``'s ``input`` on every rank (the others' ``input`` gives only the shape).
    Gradient: ``src`` gets the sum of every rank's gradient, the others zeros."""
    x = _tensor(input, "input", group)
    compiling = torch.compiler.is_compiling()
    n, _ = library._size_rank(library.group_name(group)) if compiling else _api._group_size_rank(group)
    s = int(src) if isinstance(src, int) or (isinstance(src, torch.Tensor) and src.numel() == 1) else -1
    if not 0 <= s < n:
        raise _api._rejected(group, "src", repr(src), f"must be a rank of the group (0..{n - 1})")
    if compiling:
        return torch.ops.symm.broadcast(x, s, library.group_name(group))
    return Broadcast.apply(x, s, group)


def send(input: torch.Tensor, dst: int, group: Any = None) -> torch.Tensor:
    """Sends ``input`` to group rank ``dst`` (which calls ``recv``) and returns a copy of it.

    Gradient: the returned tensor's gradient plus the gradient of the received tensor, which
    ``dst``'s backward sends back. ``send`` tells ``recv`` whether ``input`` requires grad, and
    the received tensor requires grad exactly then, so the two backwards always pair. The
    returned tensor is how autograd reaches this backward: when it is not otherwise used, add
    it to the loss with a zero weight (``loss = loss + 0 * y.sum()``); a backward that never
    runs leaves ``dst``'s gradient message unread (the next receive from ``dst`` would get it).
    """
    if torch.compiler.is_compiling():
        return library._eagerly(_send, input, dst, group)  # outside the graph (module docstring)
    return _send(input, dst, group)


def _send(input: torch.Tensor, dst: int, group: Any) -> torch.Tensor:
    return Send.apply(_tensor(input, "input", group, collective=False), dst, group)


_ANCHOR: Optional[torch.Tensor] = None


def recv(
    like: Union[torch.Tensor, int, Sequence[int]],
    src: int,
    dtype: Optional[torch.dtype] = None,
    group: Any = None,
) -> torch.Tensor:
    """Receives a new tensor from group rank ``src`` (which calls ``send``).

    ``like``: a tensor whose shape and dtype the message has (it is not written), or a shape
    (then ``dtype``, default float32). The result requires grad when the sender's tensor did
    (``send`` says so first); its backward then sends the gradient back to ``src``, whose
    ``send`` backward waits for it.

    Autograd runs that backward only when it reaches the node: ``loss.backward()`` always does;
    ``torch.autograd.grad(loss, inputs)`` only on paths to ``inputs``. When ``like`` is a tensor
    that requires grad, the received tensor hangs off ``like``'s graph (with a zero gradient),
    so pass a tensor of the graph you differentiate (e.g. the stage's input) in that case. When
    the gradient is not wanted here (grad mode off), the sender's backward waits in vain and
    raises Timeout.
    """
    if torch.compiler.is_compiling():
        return library._eagerly(_recv, like, src, dtype, group)  # outside the graph (module docstring)
    return _recv(like, src, dtype, group)


def _recv(like: Any, src: int, dtype: Optional[torch.dtype], group: Any) -> torch.Tensor:
    shape, dt = message_shape(like, dtype, torch.float32, torch.Tensor)
    return Recv.apply(_anchor(recv_grad_flag(src, group), like), shape, dt, src, group)


def _anchor(wanted: bool, like: Any) -> torch.Tensor:
    """A tensor that makes a received tensor require grad when ``wanted`` (``like`` itself when
    it requires grad: the result then hangs off its graph), else one that does not."""
    global _ANCHOR
    if not (wanted and torch.is_grad_enabled()):
        return torch.empty(0)
    if isinstance(like, torch.Tensor) and like.requires_grad:
        return like
    if _ANCHOR is None:
        _ANCHOR = torch.empty(0, requires_grad=True)
    return _ANCHOR


def sendrecv(
    input: torch.Tensor,
    dst: int,
    src: int,
    like: Union[torch.Tensor, int, Sequence[int], None] = None,
    dtype: Optional[torch.dtype] = None,
    group: Any = None,
) -> torch.Tensor:
    """Sends ``input`` to group rank ``dst`` and returns a new tensor received from group rank
    ``src``, both at once (``symm.shmem_sendrecv``: a ring needs no ordering at any size).

    ``like``: the received tensor's shape and dtype: a tensor's, or a shape (an int or a
    sequence of ints; ``None``: ``input``'s) with ``dtype`` (default: ``input``'s). Pairs with
    ``sendrecv`` on ``dst`` and ``src``: before the data each tells the other whether its input
    requires grad (a one-byte message each way), so the calls do not pair with ``send``/``recv``
    or with ``symm.shmem_*``.

    Gradient: the transposed exchange. The result's gradient goes back to ``src`` when
    ``src``'s input required grad (the result then requires grad, also where ``input`` does not:
    as for ``recv``, pass as ``like`` a tensor of the graph you differentiate), and ``input``'s
    gradient comes from ``dst`` when ``input`` requires grad. Ranks may differ in that; each backward moves
    only what its peers wait for. As for ``send``, autograd must reach the backward of a
    result whose ``dst`` sends a gradient (add ``0 * y.sum()`` to the loss when the result is
    not otherwise used); otherwise that gradient stays unread and the next receive from
    ``dst`` would take it. With grad mode off here, ``src``'s backward waits in vain and raises
    Timeout.
    """
    if torch.compiler.is_compiling():
        return library._eagerly(_sendrecv, input, dst, src, like, dtype, group)  # outside the graph
    return _sendrecv(input, dst, src, like, dtype, group)


def _sendrecv(input: Any, dst: int, src: int, like: Any, dtype: Optional[torch.dtype], group: Any) -> torch.Tensor:
    x = _tensor(input, "input", group, collective=False)
    if like is None:
        shape, dt = tuple(x.shape), dtype or x.dtype
    else:
        shape, dt = message_shape(like, dtype, x.dtype, torch.Tensor)
    wants = x.requires_grad and torch.is_grad_enabled()
    src_wants = exchange_grad_flags(wants, dst, src, group)
    anchor = _anchor(src_wants, like if isinstance(like, torch.Tensor) else x)
    return SendRecv.apply(anchor, x, dst, shape, dt, src, group, wants, src_wants)
