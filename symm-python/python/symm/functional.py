"""Differentiable collectives: out-of-place forms of the ``symm.shmem_*`` calls whose gradients
flow through the framework's autograd, for PyTorch and MindSpore tensors alike::

    import symm.functional as F
    y = F.all_gather(x, group=tp)          # (n * x.shape[0], ...); backward: reduce_scatter(sum)
    z = F.reduce_scatter(y, group=tp)      # (y.shape[0] // n, ...); backward: all_gather
    w = F.all_reduce(z, group=dp)          # backward: identity (replicated convention)

Each call goes to the implementation of its input's framework: ``symm._torch_functional``
(``torch.autograd.Function``s, traced by ``torch.compile``; its docstring has the details) or
``symm._mindspore_functional`` (``nn.Cell``s with ``bprop``). The gradients follow the RFC's
duality table on both (README, "Autograd"): all_gather and reduce_scatter are each other's
backward, all_reduce's is the identity (divided by n for avg), all_to_all's the transposed
exchange, broadcast's a sum to the source, send's and recv's the message sent back.

Every call is a collective over ``group`` (``None``: every rank symm was initialised for), and
so is its backward: the ranks run the same differentiable calls in the same order.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

__all__ = ["all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast", "send", "recv", "sendrecv"]


def _impl(*values: Any) -> Any:
    """The implementation of the framework of the first of ``values`` that is one's tensor or
    dtype (a list counts by its first entry); else of the platform in use (a shape alone)."""
    for value in values:
        if isinstance(value, (list, tuple)) and value:
            value = value[0]
        # By the modules of the type and its bases, not by isinstance: neither framework is
        # imported for the other's tensors. torch.compile folds the first test (a torch
        # tensor's type) to a constant and traces the import statement (not importlib's calls).
        if type(value).__module__.startswith("torch"):
            return _torch()
        # A MindSpore Parameter's own type is made in "abc": its bases tell.
        if any(cls.__module__.startswith("mindspore") for cls in type(value).__mro__):
            return _mindspore()
    from .platform import get_platform

    return _mindspore() if get_platform().name == "mindspore" else _torch()


def _torch() -> Any:
    from . import _torch_functional

    return _torch_functional


def _mindspore() -> Any:
    from . import _mindspore_functional

    return _mindspore_functional


def all_gather(input: Any, group: Any = None) -> Any:
    """The group's ``input`` tensors concatenated along dim 0, in group-rank order. Gradient:
    reduce_scatter(sum) of the output's gradient."""
    return _impl(input).all_gather(input, group=group)


def reduce_scatter(input: Any, op: Any = "sum", group: Any = None, low_precision_dtype: Any = None) -> Any:
    """``input``'s dim 0 in n equal parts; group rank r gets the reduction (``"sum"``, ``"avg"``)
    of part r. Gradient: all_gather of the output's gradient (divided by n for avg)."""
    return _impl(input).reduce_scatter(input, op=op, group=group, low_precision_dtype=low_precision_dtype)


def all_reduce(
    input: Any, op: Any = "sum", group: Any = None, backward: str = "identity", low_precision_dtype: Any = None
) -> Any:
    """The reduction (``"sum"``, ``"avg"``) of the group's ``input`` on every rank. Gradient:
    ``backward="identity"`` (default, the RFC's) passes it through (divided by n for avg);
    ``"all_reduce"`` all-reduces it with the same op."""
    return _impl(input).all_reduce(
        input, op=op, group=group, backward=backward, low_precision_dtype=low_precision_dtype
    )


def all_to_all(
    input: Any, output_split_sizes: Any = None, input_split_sizes: Any = None, group: Any = None
) -> Any:
    """Personalised exchange along dim 0 (a tensor with split sizes, or a list of tensors, entry
    i to group rank i). Gradient: the same exchange with the splits swapped."""
    return _impl(input).all_to_all(
        input, output_split_sizes=output_split_sizes, input_split_sizes=input_split_sizes, group=group
    )


def broadcast(input: Any, src: int, group: Any = None) -> Any:
    """Group rank ``src``'s ``input`` on every rank. Gradient: ``src`` gets the sum of every
    rank's gradient, the others zeros."""
    return _impl(input).broadcast(input, src, group=group)


def send(input: Any, dst: int, group: Any = None) -> Any:
    """Sends ``input`` to group rank ``dst`` (which calls ``recv``); returns a copy of it.
    Gradient: the copy's gradient plus the gradient ``dst``'s backward sends back."""
    return _impl(input).send(input, dst, group=group)


def recv(like: Any, src: int, dtype: Any = None, group: Any = None) -> Any:
    """Receives a new tensor from group rank ``src`` (which calls ``send``), shaped as ``like``
    (a tensor, or a shape with ``dtype``). Gradient: sent back to ``src``."""
    return _impl(like, dtype).recv(like, src, dtype=dtype, group=group)


def sendrecv(input: Any, dst: int, src: int, like: Any = None, dtype: Any = None, group: Any = None) -> Any:
    """Sends ``input`` to group rank ``dst`` and receives a new tensor from group rank ``src``, at
    once. Gradient: the transposed exchange."""
    return _impl(input, like, dtype).sendrecv(input, dst, src, like=like, dtype=dtype, group=group)


# --------------------------------------------------------------------------------------------
# What both implementations share
# --------------------------------------------------------------------------------------------


def tensor_arg(x: Any, arg: str, group: Any, tensor_type: type, collective: bool = True) -> Any:
    """``x`` when it is a ``tensor_type`` (the framework's tensor), else InvalidArgument naming
    ``arg``; in a collective the group's next round is rejected first, so that peers fail at
    once rather than at their timeout."""
    from . import _api

    if not isinstance(x, tensor_type):
        if collective:
            _api._reject(group)
        kind = f"{tensor_type.__module__.split('.')[0]}.{tensor_type.__name__}"
        raise _api._invalid_argument(arg, f"<{type(x).__name__}>", f"expected a {kind}")
    return x


def split_sizes(
    shape: Sequence[int],
    n: int,
    input_split_sizes: Any,
    output_split_sizes: Any,
    group: Any,
    exchange: Callable[[List[int]], List[int]],
) -> Tuple[List[int], List[int]]:
    """``(input splits, output splits)`` of ``all_to_all``'s tensor form over ``n`` ranks for an
    input of ``shape``, checked (each refusal rejects the group's round and names the argument);
    ``exchange(input splits)`` learns the output splits from the senders when they are needed."""
    from . import _api

    if len(shape) == 0:
        raise _api._rejected(group, "input", "a 0-d tensor", "needs a dimension 0 to split")
    rows = shape[0]
    if input_split_sizes is None:
        if rows % n:
            raise _api._rejected(
                group, "input", f"tensor of shape {tuple(shape)}", f"dim 0 must split into group size {n} equal parts"
            )
        in_splits = [rows // n] * n
    else:
        in_splits = _counts(input_split_sizes, "input_split_sizes", n, group)
        if sum(in_splits) != rows:
            raise _api._rejected(
                group, "input_split_sizes", repr(in_splits), f"must sum to input's dim 0 ({rows} rows)"
            )
    if output_split_sizes is not None:
        out_splits = _counts(output_split_sizes, "output_split_sizes", n, group)
    elif input_split_sizes is None:
        out_splits = list(in_splits)
    else:
        out_splits = exchange(in_splits)
    return in_splits, out_splits


def _counts(value: Any, arg: str, n: int, group: Any) -> List[int]:
    """``value`` (a sequence or a tensor of ``n`` row counts) as a list; refused by name else."""
    from . import _api

    out: Optional[List[int]]
    try:
        out = [int(v) for v in (value.tolist() if hasattr(value, "tolist") else value)]
    except (TypeError, ValueError):
        out = None
    if out is None or len(out) != n or any(v < 0 for v in out):
        raise _api._rejected(group, arg, repr(value), f"expected {n} row counts >= 0, one per group rank")
    return out


def message_shape(like: Any, dtype: Any, default: Any, tensor_type: type) -> Tuple[Tuple[int, ...], Any]:
    """The shape and dtype of a message to receive: ``like``'s (a ``tensor_type``), or the shape
    ``like`` (an int or a sequence of ints) with ``dtype`` (else ``default``)."""
    from . import _api

    if isinstance(like, tensor_type):
        if dtype is not None and dtype != like.dtype:
            raise _api._invalid_argument("dtype", repr(dtype), f"differs from like's {like.dtype}; pass one of them")
        return tuple(like.shape), like.dtype
    try:
        shape = (int(like),) if isinstance(like, int) else tuple(int(d) for d in like)
    except (TypeError, ValueError):
        raise _api._invalid_argument(
            "like", repr(like), "expected a tensor or a shape (an int or a sequence of ints)"
        ) from None
    return shape, (dtype if dtype is not None else default)
