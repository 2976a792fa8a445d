"""Differentiable collectives for MindSpore tensors (``symm.functional`` sends them here).

Each call is an ``nn.Cell`` whose ``construct`` runs the ``symm.shmem_*`` collective into a new
tensor and whose ``bprop`` runs the dual collective of the RFC's table, so ``mindspore.grad``
(PyNative) differentiates through it:

==============  ===============================================================
forward         backward
==============  ===============================================================
all_gather      reduce_scatter(sum) of the output's gradient
reduce_scatter  all_gather of the output's gradient (divided by n for avg)
all_reduce      identity (divided by n for avg); or all_reduce with the same op
all_to_all      all_to_all of the gradient with the split sizes swapped
broadcast       sum of every rank's gradient at the source, zeros elsewhere
send            the returned copy's gradient plus the gradient ``dst`` sends back
recv            the gradient sent back to ``src`` (zeros for ``like``)
sendrecv        the transposed sendrecv of the gradient
==============  ===============================================================

MindSpore tensors do not say whether they require grad, so send, recv and sendrecv cannot tell
their peer whether a backward will run (as the PyTorch forms do): on MindSpore both ends of a
message differentiate through it, or neither. ``recv``'s result depends on ``like`` in the
graph: pass as ``like`` a tensor of the graph being differentiated.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple

import mindspore as ms
import numpy as np
from mindspore import nn

from . import _api
from .functional import message_shape, split_sizes, tensor_arg

__all__ = ["all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast", "send", "recv", "sendrecv"]


def _tensor(x: Any, arg: str, group: Any, collective: bool = True) -> ms.Tensor:
    return tensor_arg(x, arg, group, ms.Tensor, collective)


def _dim0(t: ms.Tensor) -> Tuple[int, Tuple[int, ...]]:
    """Rows and the shape of one row (a 0-d tensor is one row of shape ())."""
    return (1, ()) if t.ndim == 0 else (t.shape[0], tuple(t.shape[1:]))


def _copy(x: ms.Tensor) -> ms.Tensor:
    """A new contiguous tensor with ``x``'s values (the collectives write in place)."""
    out = ms.mint.empty(tuple(x.shape), dtype=x.dtype)
    out.copy_(x)
    return out


def _gather(x: ms.Tensor, group: Any) -> ms.Tensor:
    n, _ = _api._group_size_rank(group)
    rows, row = _dim0(x)
    out = ms.mint.empty((n * rows,) + row, dtype=x.dtype)
    _api.shmem_allgather(out, x.contiguous(), group)
    return out


def _scatter(x: ms.Tensor, op: str, group: Any, lp: Any = None) -> ms.Tensor:
    n, _ = _api._group_size_rank(group)
    rows, row = _dim0(x)
    if x.ndim == 0 or rows % n:
        raise _api._rejected(
            group, "input", f"tensor of shape {tuple(x.shape)}", f"dim 0 must split into group size {n} equal parts"
        )
    out = ms.mint.empty((rows // n,) + row, dtype=x.dtype)
    _api.shmem_reduce_scatter(out, x.contiguous(), op, group, lp)
    return out


def _reduce(x: ms.Tensor, op: str, group: Any, lp: Any = None) -> ms.Tensor:
    out = _copy(x)
    _api.shmem_allreduce(out, op, group, lp)
    return out


def _exchange(x: ms.Tensor, out_splits: List[int], in_splits: List[int], group: Any) -> ms.Tensor:
    x = x.contiguous()
    _, row = _dim0(x)
    per_row = int(np.prod(row, dtype=np.int64))
    out = ms.mint.empty((sum(out_splits),) + row, dtype=x.dtype)
    sends, at = [], 0
    for s in in_splits:
        sends.append(x[at : at + s] if s else ms.mint.empty((0,) + row, dtype=x.dtype))
        at += s
    _api.shmem_alltoall(sends, out, [s * per_row for s in out_splits], group)
    return out


class _AllGather(nn.Cell):
    def __init__(self, group: Any) -> None:
        super().__init__()
        self.group = group

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        return _gather(x, self.group)

    def bprop(self, x: ms.Tensor, out: ms.Tensor, dout: ms.Tensor) -> Tuple[ms.Tensor]:
        grad = _scatter(dout, "sum", self.group)
        return (grad.reshape(x.shape),)


class _ReduceScatter(nn.Cell):
    def __init__(self, op: str, group: Any, lp: Any) -> None:
        super().__init__()
        self.op, self.group, self.lp = op, group, lp

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        return _scatter(x, self.op, self.group, self.lp)

    def bprop(self, x: ms.Tensor, out: ms.Tensor, dout: ms.Tensor) -> Tuple[ms.Tensor]:
        grad = _gather(dout, self.group)
        if self.op == "avg":
            grad = grad / _api._group_size_rank(self.group)[0]
        return (grad,)


class _AllReduce(nn.Cell):
    def __init__(self, op: str, group: Any, backward: str, lp: Any) -> None:
        super().__init__()
        self.op, self.group, self.backward, self.lp = op, group, backward, lp

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        return _reduce(x, self.op, self.group, self.lp)

    def bprop(self, x: ms.Tensor, out: ms.Tensor, dout: ms.Tensor) -> Tuple[ms.Tensor]:
        if self.backward == "all_reduce":
            return (_reduce(dout, self.op, self.group),)
        if self.op == "avg":
            return (dout / _api._group_size_rank(self.group)[0],)
        return (dout,)


class _AllToAll(nn.Cell):
    def __init__(self, out_splits: List[int], in_splits: List[int], group: Any) -> None:
        super().__init__()
        self.out_splits, self.in_splits, self.group = out_splits, in_splits, group

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        return _exchange(x, self.out_splits, self.in_splits, self.group)

    def bprop(self, x: ms.Tensor, out: ms.Tensor, dout: ms.Tensor) -> Tuple[ms.Tensor]:
        return (_exchange(dout, self.in_splits, self.out_splits, self.group),)


class _Broadcast(nn.Cell):
    def __init__(self, src: int, group: Any) -> None:
        super().__init__()
        self.src, self.group = src, group

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        out = _copy(x)
        _api.shmem_broadcast(out, self.src, self.group)
        return out

    def bprop(self, x: ms.Tensor, out: ms.Tensor, dout: ms.Tensor) -> Tuple[ms.Tensor]:
        total = _reduce(dout, "sum", self.group)
        is_src = _api._group_size_rank(self.group)[1] == self.src
        return (total if is_src else ms.ops.zeros_like(dout),)


class _Send(nn.Cell):
    def __init__(self, dst: int, group: Any) -> None:
        super().__init__()
        self.dst, self.group = dst, group

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        _api.shmem_send(x.contiguous(), self.dst, self.group)
        return _copy(x)

    def bprop(self, x: ms.Tensor, out: ms.Tensor, dout: ms.Tensor) -> Tuple[ms.Tensor]:
        remote = ms.mint.empty(tuple(x.shape), dtype=x.dtype)
        _api.shmem_recv(remote, self.dst, self.group)
        return (dout + remote,)


class _Recv(nn.Cell):
    def __init__(self, shape: Tuple[int, ...], dtype: Any, src: int, group: Any) -> None:
        super().__init__()
        self.shape, self.dtype, self.src, self.group = shape, dtype, src, group

    def construct(self, like: ms.Tensor) -> ms.Tensor:
        out = ms.mint.empty(self.shape, dtype=self.dtype)
        _api.shmem_recv(out, self.src, self.group)
        return out

    def bprop(self, like: ms.Tensor, out: ms.Tensor, dout: ms.Tensor) -> Tuple[ms.Tensor]:
        _api.shmem_send(dout.contiguous(), self.src, self.group)
        return (ms.ops.zeros_like(like),)


class _SendRecv(nn.Cell):
    def __init__(self, dst: int, src: int, shape: Tuple[int, ...], dtype: Any, group: Any) -> None:
        super().__init__()
        self.dst, self.src, self.shape, self.dtype, self.group = dst, src, shape, dtype, group

    def construct(self, x: ms.Tensor, like: ms.Tensor) -> ms.Tensor:
        out = ms.mint.empty(self.shape, dtype=self.dtype)
        _api.shmem_sendrecv(x.contiguous(), self.dst, out, self.src, self.group)
        return out

    def bprop(self, x: ms.Tensor, like: ms.Tensor, out: ms.Tensor, dout: ms.Tensor) -> Tuple[ms.Tensor, ms.Tensor]:
        # The transposed exchange: the gradient of what came from src goes back to it, and the
        # gradient of what went to dst comes back from it.
        grad = ms.mint.empty(tuple(x.shape), dtype=x.dtype)
        _api.shmem_sendrecv(dout.contiguous(), self.src, grad, self.dst, self.group)
        return grad, ms.ops.zeros_like(like)


def _op(op: Any, group: Any) -> str:
    """``op`` as a differentiable collective takes it: ``"sum"`` or ``"avg"`` (or 0, 1)."""
    name = {0: "sum", 1: "avg"}.get(op, op) if not isinstance(op, bool) else None
    if name not in ("sum", "avg"):
        raise _api._rejected(group, "op", repr(op), "a differentiable collective takes 'sum' or 'avg' (0 or 1)")
    return name


def _rank(value: Any, arg: str, group: Any, collective: bool = True) -> int:
    n, _ = _api._group_size_rank(group)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < n:
        if collective:
            _api._reject(group)
        raise _api._invalid_argument(arg, repr(value), f"must be a rank of the group (0..{n - 1})")
    return int(value)


def all_gather(input: Any, group: Any = None) -> ms.Tensor:
    return _AllGather(group)(_tensor(input, "input", group))


def reduce_scatter(input: Any, op: Any = "sum", group: Any = None, low_precision_dtype: Any = None) -> ms.Tensor:
    x = _tensor(input, "input", group)
    return _ReduceScatter(_op(op, group), group, low_precision_dtype)(x)


def all_reduce(
    input: Any, op: Any = "sum", group: Any = None, backward: str = "identity", low_precision_dtype: Any = None
) -> ms.Tensor:
    x = _tensor(input, "input", group)
    name = _op(op, group)
    if backward not in ("identity", "all_reduce"):
        raise _api._rejected(group, "backward", repr(backward), "accepted: 'identity', 'all_reduce'")
    return _AllReduce(name, group, backward, low_precision_dtype)(x)


def _exchange_splits(input_splits: List[int], group: Any) -> List[int]:
    """What every rank sends here (rows), learned from the ranks' ``input_splits``."""
    n = len(input_splits)
    got = ms.Tensor.from_numpy(np.zeros(n, np.int64))
    sends = [ms.Tensor.from_numpy(np.array([s], np.int64)) for s in input_splits]
    _api.shmem_alltoall(sends, got, [1] * n, group)
    return [int(v) for v in got.asnumpy().tolist()]


def all_to_all(
    input: Any, output_split_sizes: Any = None, input_split_sizes: Any = None, group: Any = None
) -> Any:
    n, _ = _api._group_size_rank(group)
    if isinstance(input, (list, tuple)):
        if output_split_sizes is not None or input_split_sizes is not None:
            raise _api._rejected(
                group, "output_split_sizes", repr(output_split_sizes), "the list form takes no split sizes"
            )
        tensors = [_tensor(t, "input", group) for t in input]
        if len(tensors) != n or any(t.ndim == 0 for t in tensors):
            raise _api._rejected(
                group,
                "input",
                f"a list of {len(tensors)} tensors",
                f"needs {n} tensors of >= 1 dimension, one per rank",
            )
        in_splits = [t.shape[0] for t in tensors]
        out_splits = _exchange_splits(in_splits, group)
        out = _AllToAll(out_splits, in_splits, group)(ms.mint.cat(list(tensors)))
        return list(ms.mint.split(out, out_splits)) if out.shape[0] else [out[0:0] for _ in out_splits]
    x = _tensor(input, "input", group)
    in_splits, out_splits = split_sizes(
        tuple(x.shape), n, input_split_sizes, output_split_sizes, group, lambda s: _exchange_splits(s, group)
    )
    return _AllToAll(out_splits, in_splits, group)(x)


def broadcast(input: Any, src: int, group: Any = None) -> ms.Tensor:
    x = _tensor(input, "input", group)
    return _Broadcast(_rank(src, "src", group), group)(x)


def send(input: Any, dst: int, group: Any = None) -> ms.Tensor:
    x = _tensor(input, "input", group, collective=False)
    return _Send(_rank(dst, "dst", group, collective=False), group)(x)


def _anchor(like: Any) -> ms.Tensor:
    """The input a received tensor hangs off in the graph: ``like`` when it is a tensor."""
    return like if isinstance(like, ms.Tensor) else ms.ops.zeros((0,), ms.float32)


def recv(like: Any, src: int, dtype: Any = None, group: Any = None) -> ms.Tensor:
    shape, dt = message_shape(like, dtype, ms.float32, ms.Tensor)
    return _Recv(shape, dt, _rank(src, "src", group, collective=False), group)(_anchor(like))


def sendrecv(
    input: Any, dst: int, src: int, like: Optional[Any] = None, dtype: Any = None, group: Any = None
) -> ms.Tensor:
    x = _tensor(input, "input", group, collective=False)
    if like is None:
        shape, dt = tuple(x.shape), dtype or x.dtype
    else:
        shape, dt = message_shape(like, dtype, x.dtype, ms.Tensor)
    dst = _rank(dst, "dst", group, collective=False)
    src = _rank(src, "src", group, collective=False)
    return _SendRecv(dst, src, shape, dt, group)(x, _anchor(x if like is None else like))

