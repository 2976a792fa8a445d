"""The framework a test rank runs under, behind one small interface, so that the scenarios of
``scenarios_platform.py`` are written once and run on PyTorch (``worker.py``) and on MindSpore
(``ms_worker.py``). Values go in and come out as NumPy arrays; expected results are computed in
NumPy, never by the framework under test.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import numpy as np

#: The dtypes every scenario covers, by symm's names.
FLOATS = ("float32", "float64", "float16", "bfloat16")
INTS = ("int32", "int64")


class Torch:
    name = "torch"

    def __init__(self) -> None:
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist

    def dtype(self, name: str) -> Any:
        return getattr(self.torch, name)

    def tensor(self, values: Any, dtype: str) -> Any:
        """A new tensor of ``dtype`` with ``values`` (exactly representable in it)."""
        return self.torch.from_numpy(np.array(values, dtype=np.float64)).to(self.dtype(dtype)).contiguous()

    def empty(self, shape: Sequence[int], dtype: str) -> Any:
        return self.torch.empty(tuple(shape), dtype=self.dtype(dtype))

    def numpy(self, t: Any) -> np.ndarray:
        """``t``'s values as float64 (every dtype here converts exactly)."""
        return t.detach().to(self.torch.float64).numpy().copy()

    def fill(self, t: Any, values: Any) -> None:
        """Writes ``values`` into ``t`` in place (a symmetric tensor keeps its memory)."""
        t.copy_(self.tensor(np.broadcast_to(values, tuple(t.shape)), _name(t.dtype)))

    def grad(self, f: Callable[[Any], Any], x: Any, weight: Any) -> np.ndarray:
        """d sum(f(x) * weight) / dx, by the framework's autograd."""
        x = x.detach().clone().requires_grad_(True)
        y = f(x)
        (y * self.tensor(weight, _name(y.dtype))).sum().backward()
        # No gradient reached x (recv's `like` only places the result in the graph): zero.
        return np.zeros(tuple(x.shape)) if x.grad is None else self.numpy(x.grad)

    def barrier(self) -> None:
        self.dist.barrier()

    def future_value(self, future: Any) -> Any:
        return future.wait()  # torch.futures.Future


class MindSpore:
    name = "mindspore"

    def __init__(self) -> None:
        import mindspore as ms

        self.ms = ms

    def dtype(self, name: str) -> Any:
        return getattr(self.ms, name)

    def tensor(self, values: Any, dtype: str) -> Any:
        return self.ms.Tensor(np.array(values, dtype=np.float64)).astype(self.dtype(dtype))

    def empty(self, shape: Sequence[int], dtype: str) -> Any:
        return self.ms.mint.empty(tuple(shape), dtype=self.dtype(dtype))

    def numpy(self, t: Any) -> np.ndarray:
        return t.astype(self.ms.float64).asnumpy().copy()

    def fill(self, t: Any, values: Any) -> None:
        # MindSpore's CPU in-place arithmetic is a no-op; copy_ writes through.
        t.copy_(self.tensor(np.broadcast_to(values, tuple(t.shape)), _name(t.dtype)))

    def grad(self, f: Callable[[Any], Any], x: Any, weight: Any) -> np.ndarray:
        w = None

        def loss(v: Any) -> Any:
            nonlocal w
            y = f(v)
            w = self.tensor(weight, _name(y.dtype))
            return (y * w).sum()

        return self.numpy(self.ms.grad(loss)(x))

    def barrier(self) -> None:
        import symm

        symm.barrier()

    def future_value(self, future: Any) -> Any:
        return future.result(timeout=60)  # concurrent.futures.Future


def _name(dtype: Any) -> str:
    """symm's name of a framework dtype (``torch.bfloat16`` and ``BFloat16`` -> ``bfloat16``)."""
    text = str(dtype).rpartition(".")[2].lower()
    return {"bool": "bool"}.get(text, text)


def current() -> Any:
    """The framework of this rank: ``SYMM_TEST_FRAMEWORK`` (set by ``ms_worker.py``), else torch."""
    return MindSpore() if os.environ.get("SYMM_TEST_FRAMEWORK") == "mindspore" else Torch()
