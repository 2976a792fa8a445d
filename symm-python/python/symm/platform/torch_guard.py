"""The interop guard for ``torch.distributed`` (``SYMM_VALIDATE=1``).

symm and ``torch.distributed`` (Gloo on CPU, HCCL on Ascend) run side by side in one training
step, on different groups and different tensors. Two things break that, and neither library can
see them alone: a tensor (or another view of its storage) used by one library while the other
library's asynchronous operation on it has not completed, and one phase of one tensor split
between the two (a flat gradient buffer whose first half symm reduces while Gloo reduces the
second half: each library orders only its own operations). The guard wraps the public
collectives of ``torch.distributed`` so that:

- before a ``torch.distributed`` call, each of its tensors' storage is checked against symm's
  asynchronous operations in flight (``Communicator.in_flight_clash``);
- an asynchronous ``torch.distributed`` call (``async_op=True``, ``isend``, ``irecv``) is
  registered with its tensors' storage until its work reports ``is_completed()``, and every
  symm call checks its tensors against it (native side, ``work.rs``).

Either refusal raises ``InvalidArgument`` naming the argument, the tensor, both libraries and
the rule, before anything is sent. Only the names of ``torch.distributed`` are wrapped, when
the guard is installed (``symm.init``): a function imported by name before that, or torch's
functional collectives (``torch.distributed._functional_collectives``), are not seen.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Iterator, List, Tuple

import torch
import torch.distributed as dist

from .base import OtherLibraryGuard

#: The collectives and messages of ``torch.distributed`` whose tensors the guard checks.
GUARDED = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "broadcast",
    "reduce",
    "gather",
    "scatter",
    "send",
    "recv",
    "isend",
    "irecv",
)

#: Set on a wrapper, so that installing twice wraps once.
_MARK = "__symm_guarded__"


def _tensors(bound: inspect.BoundArguments) -> Iterator[Tuple[str, torch.Tensor]]:
    """Every tensor among the arguments, named (``tensor_list[1]`` for a list's entry)."""
    for name, value in bound.arguments.items():
        if isinstance(value, torch.Tensor):
            yield name, value
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                if isinstance(v, torch.Tensor):
                    yield f"{name}[{i}]", v


def _storage(t: torch.Tensor) -> Tuple[int, int]:
    try:
        s = t.untyped_storage()
        return s.data_ptr(), s.nbytes()
    except (RuntimeError, NotImplementedError, TypeError):
        return 0, 0


def _shown(arg: str, t: torch.Tensor) -> str:
    return f"{arg} ({tuple(t.shape)} x {t.dtype} at {t.data_ptr():#x})"


def _backend(bound: inspect.BoundArguments) -> str:
    try:
        return str(dist.get_backend(bound.arguments.get("group")))
    except (RuntimeError, ValueError):
        return "?"


def _library(bound: inspect.BoundArguments) -> str:
    return f"torch.distributed ({_backend(bound)})"


def _wrap(name: str, fn: Callable[..., Any], guard: OtherLibraryGuard) -> Callable[..., Any]:
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return fn(*args, **kwargs)  # torch reports the bad call itself
        if _backend(bound) == "symm":
            # symm's own torch.distributed backend (symm/c10d.py): these are symm's operations,
            # which symm checks itself (and whose works torch wraps so that is_completed() never
            # turns true: registered here, they would block their tensors for good).
            return fn(*args, **kwargs)
        tensors: List[Tuple[str, torch.Tensor, int, int]] = []
        for arg, t in _tensors(bound):
            lo, n = _storage(t)
            if n == 0:
                continue
            clash = guard.clash(lo, n)
            if clash is not None:
                library = _library(bound)
                raise guard.refuse(
                    arg,
                    _shown(arg, t),
                    f"{library} {name} refused: its memory is also that of {clash}; a tensor belongs to the "
                    "library whose operation uses it until that work has completed, and one phase of one tensor "
                    'is never split between two libraries (wait() for symm\'s work first; docs/design.md, "Interop")',
                )
            tensors.append((arg, t, lo, n))
        work = fn(*args, **kwargs)
        if work is not None and hasattr(work, "is_completed") and tensors:
            guard.started(_library(bound), name, work, [(_shown(a, t), lo, n) for a, t, lo, n in tensors])
        return work

    setattr(guarded, _MARK, True)
    return guarded


def install(guard: OtherLibraryGuard) -> None:
    """Wraps ``torch.distributed``'s collectives (see the module's docs); idempotent."""
    for name in GUARDED:
        fn = getattr(dist, name, None)
        if fn is None or getattr(fn, _MARK, False):
            continue
        setattr(dist, name, _wrap(name, fn, guard))
