"""symm's collectives as torch operators (``torch.ops.symm.*``), so that ``torch.compile`` traces
them (PyTorch only; registered on first import, which ``symm.functional``, ``symm.autograd`` and
symm's start-up under torch do).

Two kinds, in the namespace ``symm``:

- **functional** (new output tensors; a fake kernel for tracing and the autograd formula of
  ``symm.autograd``'s duality table): ``all_gather``, ``reduce_scatter``, ``all_reduce``,
  ``all_to_all``, ``broadcast``, and ``reduce`` (broadcast's dual: the sum on one rank). Under
  ``torch.compile`` ``symm.functional``'s collectives call them. Their formulas build the same
  graph on every rank (what differs by rank is read when an operator runs): the ranks of a node
  share torch's compile cache;
- **in place** (``mutates_args``: compile functionalizes them, and Inductor writes in place
  again): ``shmem_allreduce``, ``shmem_reduce_scatter``, ``shmem_allgather``, ``shmem_alltoall``,
  ``shmem_broadcast``, ``shmem_send``, ``shmem_recv``, ``shmem_sendrecv``, with the public
  calls' parameters. ``shmem_send`` writes nothing and returns nothing: it is registered as an
  ordered effect, so compile neither drops nor reorders it.

Dynamo does not trace the native ``symm.shmem_*`` functions: each has a substitute
(``torch._dynamo.substitute_in_graph``) that calls the in-place operator, or, when a tensor
requires grad in grad mode, the functional operator and ``copy_`` into the tensor written (the
gradient of the eager call, see ``symm.autograd``). Those substitutes are registered when
``torch._dynamo`` is imported (``torch.compile`` imports it), so symm's start-up does not pay for
Dynamo's import.

A group travels as the name of its process group (``group.group_name``), resolved back with
torch's resolver (``_resolve_process_group``); ``""`` is ``group=None`` (every rank symm was
initialised for). Every operator is a collective like the call it stands for: the ranks of the
group run the same operators in the same order (a compiled graph runs them in one order on every
rank that compiles the same program). Collective-style operators carry
``torch.Tag.needs_fixed_stride_order``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import _api, _symm

__all__ = ["group_name", "resolve_group"]

_TAGS = (torch.Tag.needs_fixed_stride_order,)
_CODES = {0: "sum", 1: "avg", 2: "max", 3: "min"}


def group_name(group: Any) -> str:
    """The name an operator takes for ``group``: its process group's ``group_name``, ``""`` for
    None (every rank symm was initialised for)."""
    return "" if group is None else str(group.group_name)


def resolve_group(name: str) -> Any:
    """The process group named ``name`` (torch's resolver); None for ``""``."""
    if name == "":
        return None
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(name)


def _differentiable(op: Any, group: Any) -> str:
    """``op`` as ``"sum"`` or ``"avg"`` (``symm.autograd.differentiable_op``, which rejects any
    other outside the graph)."""
    key = op.strip().lower() if isinstance(op, str) else op
    if key in ("sum", 0) and not isinstance(op, bool):
        return "sum"
    if key in ("avg", 1) and not isinstance(op, bool):
        return "avg"
    from .autograd import differentiable_op

    return _eagerly(differentiable_op, op, group)


def _size_rank(name: str) -> Tuple[int, int]:
    """``(size, rank)`` of the group named ``name``, from torch.distributed (no symm call: fake
    kernels and traced backward formulas use it before symm may have started)."""
    import torch.distributed as dist

    group = resolve_group(name)
    if group is None and _api._state is not None:
        st = _api._state
        return len(st.ranks), st.ranks.index(dist.get_rank())
    return dist.get_world_size(group), dist.get_rank(group)


def _op_name(op: Any) -> str:
    """A reduction as the operators take it: a name (any spelling the native call reads) or a
    code."""
    if isinstance(op, int) and not isinstance(op, bool) and op in _CODES:
        return _CODES[op]
    return op if isinstance(op, str) else repr(op)


def _lp_name(value: Any) -> Optional[str]:
    """``low_precision_dtype`` as the operators take it (a dtype by its name)."""
    if isinstance(value, torch.dtype):
        return str(value).rpartition(".")[2]
    return value


def _dim0(t: Tensor) -> Tuple[int, Tuple[int, ...]]:
    return (1, ()) if t.dim() == 0 else (t.shape[0], tuple(t.shape[1:]))


# --------------------------------------------------------------------------------------------
# functional operators (symm.functional under torch.compile)
# --------------------------------------------------------------------------------------------


@torch.library.custom_op("symm::all_gather", mutates_args=(), tags=_TAGS)
def all_gather(input: Tensor, group_name: str) -> Tensor:
    """``symm.functional.all_gather``: the group's inputs concatenated along dim 0."""
    from .autograd import _all_gather

    with torch.no_grad():
        return _all_gather(input, resolve_group(group_name))


@all_gather.register_fake
def _(input: Tensor, group_name: str) -> Tensor:
    n, _ = _size_rank(group_name)
    rows, row = _dim0(input)
    return input.new_empty((n * rows,) + row)


def _all_gather_setup(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
    ctx.shape, ctx.group_name = tuple(inputs[0].shape), inputs[1]


def _all_gather_backward(ctx: Any, grad: Tensor) -> Tuple[Tensor, None]:
    return torch.ops.symm.reduce_scatter(grad, "sum", ctx.group_name, None).reshape(ctx.shape), None


all_gather.register_autograd(_all_gather_backward, setup_context=_all_gather_setup)


@torch.library.custom_op("symm::reduce_scatter", mutates_args=(), tags=_TAGS)
def reduce_scatter(input: Tensor, op: str, group_name: str, low_precision_dtype: Optional[str]) -> Tensor:
    """``symm.functional.reduce_scatter``: dim 0 in n parts, rank r gets the reduction of part r."""
    from .autograd import _reduce_scatter

    group = resolve_group(group_name)
    n, _ = _api._group_size_rank(group)
    rows, row = _dim0(input)
    if input.dim() == 0 or rows % n:
        raise _api._rejected(
            group, "input", f"tensor of shape {tuple(input.shape)}", f"dim 0 must split into group size {n} equal parts"
        )
    with torch.no_grad():
        return _reduce_scatter(input, op, group, (rows // n,) + row, low_precision_dtype)


@reduce_scatter.register_fake
def _(input: Tensor, op: str, group_name: str, low_precision_dtype: Optional[str]) -> Tensor:
    n, _ = _size_rank(group_name)
    rows, row = _dim0(input)
    if input.dim() == 0 or rows % n:
        raise _api._invalid_argument(
            "input", f"tensor of shape {tuple(input.shape)}", f"dim 0 must split into group size {n} equal parts"
        )
    return input.new_empty((rows // n,) + row)


def _reduce_scatter_setup(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
    ctx.op, ctx.group_name = inputs[1], inputs[2]
    ctx.n, _ = _size_rank(ctx.group_name)


def _reduce_scatter_backward(ctx: Any, grad: Tensor) -> Tuple[Tensor, None, None, None]:
    g = torch.ops.symm.all_gather(grad, ctx.group_name)
    return (g / ctx.n if ctx.op == "avg" else g), None, None, None


reduce_scatter.register_autograd(_reduce_scatter_backward, setup_context=_reduce_scatter_setup)


@torch.library.custom_op("symm::all_reduce", mutates_args=(), tags=_TAGS)
def all_reduce(input: Tensor, op: str, group_name: str, backward: str, low_precision_dtype: Optional[str]) -> Tensor:
    """``symm.functional.all_reduce``: the reduction of the group's inputs, on every rank;
    ``backward``: ``"identity"`` or ``"all_reduce"`` (the two conventions of ``symm.autograd``)."""
    out = input.contiguous().clone()
    with torch.no_grad():
        _symm.shmem_allreduce(out, op, resolve_group(group_name), low_precision_dtype)
    return out


@all_reduce.register_fake
def _(input: Tensor, op: str, group_name: str, backward: str, low_precision_dtype: Optional[str]) -> Tensor:
    return torch.empty_like(input, memory_format=torch.contiguous_format)


def _all_reduce_setup(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
    ctx.op, ctx.group_name, ctx.mode = inputs[1], inputs[2], inputs[3]
    ctx.n, _ = _size_rank(ctx.group_name)


def _all_reduce_backward(ctx: Any, grad: Tensor) -> Tuple[Tensor, None, None, None, None]:
    if ctx.mode == "identity":
        g = grad if ctx.op == "sum" else grad / ctx.n
    else:
        g = torch.ops.symm.all_reduce(grad, ctx.op, ctx.group_name, "identity", None)
    return g, None, None, None, None


all_reduce.register_autograd(_all_reduce_backward, setup_context=_all_reduce_setup)


@torch.library.custom_op("symm::all_to_all", mutates_args=(), tags=_TAGS)
def all_to_all(
    input: Tensor, output_split_sizes: Sequence[int], input_split_sizes: Sequence[int], group_name: str
) -> Tensor:
    """``symm.functional.all_to_all`` with both split sizes given (rows of dim 0)."""
    from .autograd import _all_to_all

    with torch.no_grad():
        return _all_to_all(input, list(output_split_sizes), list(input_split_sizes), resolve_group(group_name))


@all_to_all.register_fake
def _(input: Tensor, output_split_sizes: Sequence[int], input_split_sizes: Sequence[int], group_name: str) -> Tensor:
    _, row = _dim0(input)
    return input.new_empty((sum(output_split_sizes),) + row)


def _all_to_all_setup(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
    ctx.out_splits, ctx.in_splits, ctx.group_name = list(inputs[1]), list(inputs[2]), inputs[3]


def _all_to_all_backward(ctx: Any, grad: Tensor) -> Tuple[Tensor, None, None, None]:
    return torch.ops.symm.all_to_all(grad, ctx.in_splits, ctx.out_splits, ctx.group_name), None, None, None


all_to_all.register_autograd(_all_to_all_backward, setup_context=_all_to_all_setup)


@torch.library.custom_op("symm::broadcast", mutates_args=(), tags=_TAGS)
def broadcast(input: Tensor, src: int, group_name: str) -> Tensor:
    """``symm.functional.broadcast``: group rank ``src``'s input on every rank."""
    out = input.contiguous().clone()
    with torch.no_grad():
        _symm.shmem_broadcast(out, src, resolve_group(group_name))
    return out


@broadcast.register_fake
def _(input: Tensor, src: int, group_name: str) -> Tensor:
    return torch.empty_like(input, memory_format=torch.contiguous_format)


def _broadcast_setup(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
    ctx.src, ctx.group_name = inputs[1], inputs[2]


def _broadcast_backward(ctx: Any, grad: Tensor) -> Tuple[Tensor, None, None]:
    return torch.ops.symm.reduce(grad, ctx.src, ctx.group_name), None, None


broadcast.register_autograd(_broadcast_backward, setup_context=_broadcast_setup)


@torch.library.custom_op("symm::reduce", mutates_args=(), tags=_TAGS)
def reduce(input: Tensor, dst: int, group_name: str) -> Tensor:
    """The dual of ``broadcast``: the sum of the group's inputs on group rank ``dst``, zeros on
    the others. Which rank this is is read when it runs, not when it is traced: a formula that
    branched on the rank would make the graphs differ between ranks (so that a compile cache
    shared by the ranks of a node could hand one rank's graph to another)."""
    group = resolve_group(group_name)
    out = input.contiguous().clone()
    with torch.no_grad():
        _symm.shmem_allreduce(out, "sum", group)
        if _api._group_size_rank(group)[1] != dst:
            out.zero_()
    return out


@reduce.register_fake
def _(input: Tensor, dst: int, group_name: str) -> Tensor:
    return torch.empty_like(input, memory_format=torch.contiguous_format)


def _reduce_setup(ctx: Any, inputs: Tuple[Any, ...], output: Tensor) -> None:
    ctx.dst, ctx.group_name = inputs[1], inputs[2]


def _reduce_backward(ctx: Any, grad: Tensor) -> Tuple[Tensor, None, None]:
    return torch.ops.symm.broadcast(grad, ctx.dst, ctx.group_name), None, None


reduce.register_autograd(_reduce_backward, setup_context=_reduce_setup)


# --------------------------------------------------------------------------------------------
# in-place operators: the public calls (blocking), for compile to functionalize
# --------------------------------------------------------------------------------------------


@torch.library.custom_op("symm::shmem_allreduce", mutates_args=("tensor",), tags=_TAGS)
def shmem_allreduce(tensor: Tensor, op: str, group_name: str, low_precision_dtype: Optional[str]) -> None:
    """``symm.shmem_allreduce``, blocking."""
    with torch.no_grad():
        _symm.shmem_allreduce(tensor, op, resolve_group(group_name), low_precision_dtype)


@torch.library.custom_op("symm::shmem_reduce_scatter", mutates_args=("output_tensor",), tags=_TAGS)
def shmem_reduce_scatter(
    output_tensor: Tensor, input_tensor: Tensor, op: str, group_name: str, low_precision_dtype: Optional[str]
) -> None:
    """``symm.shmem_reduce_scatter``, blocking."""
    with torch.no_grad():
        _symm.shmem_reduce_scatter(output_tensor, input_tensor, op, resolve_group(group_name), low_precision_dtype)


@torch.library.custom_op("symm::shmem_allgather", mutates_args=("output_tensor",), tags=_TAGS)
def shmem_allgather(output_tensor: Tensor, input_tensor: Tensor, group_name: str) -> None:
    """``symm.shmem_allgather``, blocking."""
    with torch.no_grad():
        _symm.shmem_allgather(output_tensor, input_tensor, resolve_group(group_name))


@torch.library.custom_op("symm::shmem_alltoall", mutates_args=("receive_tensor",), tags=_TAGS)
def shmem_alltoall(
    send_tensor_list: List[Tensor], receive_tensor: Tensor, receive_list: Sequence[int], group_name: str
) -> None:
    """``symm.shmem_alltoall``, blocking (``receive_list``: element counts)."""
    with torch.no_grad():
        _symm.shmem_alltoall(list(send_tensor_list), receive_tensor, list(receive_list), resolve_group(group_name))


@torch.library.custom_op("symm::shmem_broadcast", mutates_args=("tensor",), tags=_TAGS)
def shmem_broadcast(tensor: Tensor, src_rank: int, group_name: str) -> None:
    """``symm.shmem_broadcast``, blocking."""
    with torch.no_grad():
        _symm.shmem_broadcast(tensor, src_rank, resolve_group(group_name))


@torch.library.custom_op("symm::shmem_send", mutates_args=())
def shmem_send(tensor: Tensor, dst_rank: int, group_name: str) -> None:
    """``symm.shmem_send``, blocking."""
    with torch.no_grad():
        _symm.shmem_send(tensor, dst_rank, resolve_group(group_name))


@shmem_send.register_fake
def _(tensor: Tensor, dst_rank: int, group_name: str) -> None:
    return None


@torch.library.custom_op("symm::shmem_recv", mutates_args=("tensor",))
def shmem_recv(tensor: Tensor, src_rank: int, group_name: str) -> None:
    """``symm.shmem_recv``, blocking."""
    with torch.no_grad():
        _symm.shmem_recv(tensor, src_rank, resolve_group(group_name))


@torch.library.custom_op("symm::shmem_sendrecv", mutates_args=("recv_tensor",))
def shmem_sendrecv(send_tensor: Tensor, dst_rank: int, recv_tensor: Tensor, src_rank: int, group_name: str) -> None:
    """``symm.shmem_sendrecv``, blocking."""
    with torch.no_grad():
        _symm.shmem_sendrecv(send_tensor, dst_rank, recv_tensor, src_rank, resolve_group(group_name))


def _register_effects() -> None:
    """A send writes nothing and returns nothing: without an effect, compile would drop it."""
    from torch._higher_order_ops.effects import EffectType

    torch.library._register_effectful_op("symm::shmem_send", EffectType.ORDERED)


_register_effects()


# --------------------------------------------------------------------------------------------
# Dynamo: what it traces in place of the native symm.shmem_* (same signatures)
# --------------------------------------------------------------------------------------------


def _records(*tensors: Any) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in tensors)


def _call(function: Callable[..., Any], *args: Any) -> Any:
    return function(*args)


#: ``_call`` outside the graph (``torch._dynamo.disable``, set with the substitutes): a graph
#: break, then the native call as in eager mode (which records its backward, or returns its
#: work).
_eagerly: Callable[..., Any] = _call


def _allreduce(tensor: Any, op: Any = "sum", group: Any = None, low_precision_dtype: Any = None, async_op: Any = False):
    if async_op:
        return _eagerly(_symm.shmem_allreduce, tensor, op, group, low_precision_dtype, async_op)
    name, lp = group_name(group), _lp_name(low_precision_dtype)
    if _records(tensor):
        tensor.copy_(torch.ops.symm.all_reduce(tensor, _op_name(op), name, "identity", lp))
    else:
        torch.ops.symm.shmem_allreduce(tensor, _op_name(op), name, lp)
    return None


def _reduce_scatter(
    output_tensor: Any,
    input_tensor: Any,
    op: Any = "sum",
    group: Any = None,
    low_precision_dtype: Any = None,
    async_op: Any = False,
):
    if async_op:
        args = (output_tensor, input_tensor, op, group, low_precision_dtype, async_op)
        return _eagerly(_symm.shmem_reduce_scatter, *args)
    name, lp = group_name(group), _lp_name(low_precision_dtype)
    if _records(output_tensor, input_tensor):
        out = torch.ops.symm.reduce_scatter(input_tensor.reshape(-1), _op_name(op), name, lp)
        output_tensor.copy_(out.view(output_tensor.shape))
    else:
        torch.ops.symm.shmem_reduce_scatter(output_tensor, input_tensor, _op_name(op), name, lp)
    return None


def _allgather(output_tensor: Any, input_tensor: Any, group: Any = None, async_op: Any = False):
    if async_op:
        return _eagerly(_symm.shmem_allgather, output_tensor, input_tensor, group, async_op)
    name = group_name(group)
    if _records(output_tensor, input_tensor):
        output_tensor.copy_(torch.ops.symm.all_gather(input_tensor.reshape(-1), name).view(output_tensor.shape))
    else:
        torch.ops.symm.shmem_allgather(output_tensor, input_tensor, name)
    return None


def _alltoall(send_tensor_list: Any, receive_tensor: Any, receive_list: Any, group: Any = None, async_op: Any = False):
    if async_op:
        return _eagerly(_symm.shmem_alltoall, send_tensor_list, receive_tensor, receive_list, group, async_op)
    name = group_name(group)
    counts = [int(c) for c in receive_list]
    sends = list(send_tensor_list)
    if _records(receive_tensor, *sends):
        flat = torch.cat([s.reshape(-1) for s in sends])
        got = torch.ops.symm.all_to_all(flat, counts, [s.numel() for s in sends], name)
        receive_tensor.view(-1)[: sum(counts)].copy_(got)
    else:
        torch.ops.symm.shmem_alltoall(sends, receive_tensor, counts, name)
    return None


def _broadcast(tensor: Any, src_rank: Any, group: Any = None, async_op: Any = False):
    if async_op:
        return _eagerly(_symm.shmem_broadcast, tensor, src_rank, group, async_op)
    name = group_name(group)
    if _records(tensor):
        tensor.copy_(torch.ops.symm.broadcast(tensor, int(src_rank), name))
    else:
        torch.ops.symm.shmem_broadcast(tensor, int(src_rank), name)
    return None


# A message whose tensors require grad records its backward outside the graph: a receive's
# gradient goes back to a sender whose program the graph does not see.


def _send(tensor: Any, dst_rank: Any, group: Any = None, async_op: Any = False):
    if async_op or _records(tensor):
        return _eagerly(_symm.shmem_send, tensor, dst_rank, group, async_op)
    torch.ops.symm.shmem_send(tensor, int(dst_rank), group_name(group))
    return None


def _recv(tensor: Any, src_rank: Any, group: Any = None, async_op: Any = False):
    if async_op or _records(tensor):
        return _eagerly(_symm.shmem_recv, tensor, src_rank, group, async_op)
    torch.ops.symm.shmem_recv(tensor, int(src_rank), group_name(group))
    return None


def _sendrecv(
    send_tensor: Any, dst_rank: Any, recv_tensor: Any, src_rank: Any, group: Any = None, async_op: Any = False
):
    if async_op or _records(send_tensor, recv_tensor):
        return _eagerly(_symm.shmem_sendrecv, send_tensor, dst_rank, recv_tensor, src_rank, group, async_op)
    torch.ops.symm.shmem_sendrecv(send_tensor, int(dst_rank), recv_tensor, int(src_rank), group_name(group))
    return None


_SUBSTITUTES: List[Tuple[str, Callable[..., Any]]] = [
    ("shmem_allreduce", _allreduce),
    ("shmem_reduce_scatter", _reduce_scatter),
    ("shmem_allgather", _allgather),
    ("shmem_alltoall", _alltoall),
    ("shmem_broadcast", _broadcast),
    ("shmem_send", _send),
    ("shmem_recv", _recv),
    ("shmem_sendrecv", _sendrecv),
]

_registered = False
_lock = threading.Lock()


def _register_dynamo() -> None:
    """Tells Dynamo how to trace the native calls (once ``torch._dynamo`` is loaded)."""
    global _registered
    with _lock:
        if _registered:
            return
        _registered = True
    import torch._dynamo

    global _eagerly
    _eagerly = torch._dynamo.disable(_call, reason="symm: an asynchronous call, or a message that records its backward")
    for function, substitute in _SUBSTITUTES:
        torch._dynamo.substitute_in_graph(getattr(_symm, function))(substitute)
    # Frames of symm's runtime are never compiled: the native calls reach them (symm.init, the
    # platform's helpers, the autograd Functions of a call that records its backward) from code
    # that runs eagerly inside a compiled function (after a graph break), where Dynamo would
    # otherwise trace them as frames of their own.
    from torch._dynamo import trace_rules

    for module in ("symm._api", "symm._diag", "symm.autograd", "symm.platform"):
        trace_rules.add(module)
    # Traced as constants: a group's name, size and rank do not change.
    for helper in (group_name, _size_rank):
        torch._dynamo.assume_constant_result(helper)


class _AfterDynamo(importlib.abc.MetaPathFinder):
    """Runs ``_register_dynamo`` right after ``torch._dynamo`` is imported (by ``torch.compile``)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != "torch._dynamo":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        loader = getattr(spec, "loader", None)
        if spec is None or loader is None or not hasattr(loader, "exec_module"):
            return None
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _register_dynamo()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _install() -> None:
    if "torch._dynamo" in sys.modules:
        _register_dynamo()
        return
    if not any(isinstance(f, _AfterDynamo) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterDynamo())
        if "torch._dynamo" in sys.modules:  # imported meanwhile by another thread
            _register_dynamo()


_install()
