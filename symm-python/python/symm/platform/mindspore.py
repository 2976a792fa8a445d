"""The MindSpore platform: ``mindspore.communication`` for the job and its groups, CPU tensors.

- Rank and world size come from ``mindspore.communication`` (``init()`` must have run, e.g. under
  ``msrun`` or MindSpore's dynamic-cluster environment: ``MS_ROLE``, ``MS_WORKER_NUM``,
  ``MS_SCHED_HOST``, ``MS_SCHED_PORT``).
- Groups are group names (``str``): MindSpore's world group, names made by
  ``mindspore.communication.create_group(name, ranks)`` (only the members call it), HyperParallel's
  ``platform.create_group``; ``get_process_group_ranks(name)`` gives their global ranks in
  group-rank order.
- The key-value store of the start-up exchange is a MindSpore ``TCPStore`` that the group's first
  rank serves; its port (and a fresh secret) reach the other members through a MindSpore
  ``AllReduce`` on the group, one of the few collectives MindSpore's CPU backend has.
- Tensors are described by ``data_ptr()``, element count, dtype and contiguity. Heap blocks become
  tensors through NumPy views (``Tensor.from_numpy``, zero-copy; 16-bit and 8-bit floats NumPy
  lacks are viewed as ``uint16``/``uint8`` first, then as the dtype), which keep the block alive
  for as long as the tensor lives. MindSpore's pluggable allocator serves Ascend only, so this is
  how a CPU tensor can live in the heap.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import os
import secrets
import socket
import time
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence

import mindspore as ms
import numpy as np
from mindspore import communication as comm
from mindspore import ops

from .base import Desc, Platform

#: MindSpore dtype -> symm's name for it, and the NumPy dtype a heap block is viewed as.
_DTYPES: Dict[Any, str] = {
    ms.float32: "float32",
    ms.float64: "float64",
    ms.float16: "float16",
    ms.bfloat16: "bfloat16",
    ms.int8: "int8",
    ms.int16: "int16",
    ms.int32: "int32",
    ms.int64: "int64",
    ms.uint8: "uint8",
    ms.bool_: "bool",
}
for _name in ("float8_e4m3fn", "float8_e5m2"):
    if hasattr(ms, _name):
        _DTYPES[getattr(ms, _name)] = _name
_BY_NAME = {name: dtype for dtype, name in _DTYPES.items()}
#: NumPy has no bfloat16 or float8: their blocks are viewed as unsigned words of the same size.
_NUMPY = {"bfloat16": np.uint16, "float8_e4m3fn": np.uint8, "float8_e5m2": np.uint8}


def _store_timeout() -> datetime.timedelta:
    """How long the members of a group wait for its store's first rank: symm's wait bound
    (``SYMMETRIC_MEMORY_TIMEOUT``, seconds; a value symm refuses gets the default here and is
    refused by name when symm starts)."""
    try:
        seconds = float(os.environ.get("SYMMETRIC_MEMORY_TIMEOUT", "") or 120)
    except ValueError:
        seconds = 120.0
    return datetime.timedelta(seconds=seconds if seconds > 0 else 120.0)


class MindSporePlatform(Platform):
    """MindSpore (``mindspore.communication``), CPU tensors."""

    name = "mindspore"
    how_to_start = (
        "call mindspore.communication.init() first, in a job started by msrun or MindSpore's dynamic-cluster "
        "environment (MS_ROLE, MS_WORKER_NUM, MS_SCHED_HOST, MS_SCHED_PORT)"
    )

    def __init__(self) -> None:
        self._stores: Dict[Hashable, Any] = {}

    # -- the job ---------------------------------------------------------------------------
    def is_initialized(self) -> bool:
        return bool(comm.GlobalComm.INITED)

    def rank(self) -> int:
        return comm.get_rank()

    def world_size(self) -> int:
        return comm.get_group_size()

    def store(self, prefix: str, group: Any = None) -> Any:
        # One TCPStore per group symm starts on, served by the group's first rank: MindSpore
        # offers its job no store of its own. Collective over the group.
        key = self.group_key(group)
        base = self._stores.get(key)
        if base is None:
            base = self._stores[key] = _open_store(self._name(group), self.group_ranks(group), self.rank())
        return _PrefixStore(base, prefix)

    def share_secret(self, group: Any, ranks: Sequence[int]) -> Optional[bytes]:
        # Over MindSpore's own connections (mccl), not the store: the first rank's random bytes,
        # summed with the others' zeros (exact in float32: every value is below 256).
        mine = secrets.token_bytes(32) if self.rank() == ranks[0] else bytes(32)
        summed = _all_reduce_ints(list(mine), self._name(group))
        return bytes(summed).hex().encode()

    # -- groups ----------------------------------------------------------------------------
    def group_key(self, group: Any) -> Hashable:
        return self._name(group)

    def group_ranks(self, group: Any) -> Sequence[int]:
        name = self._name(group)
        if not isinstance(name, str):
            raise LookupError(f"expected a MindSpore group name (str), got {type(group).__name__}")
        try:
            return list(comm.get_process_group_ranks(name))
        except (KeyError, ValueError, RuntimeError, TypeError) as e:
            raise LookupError(f"MindSpore does not know a group named {name!r} on this rank ({_first_line(e)})") from e

    def create_group(self, ranks: Sequence[int]) -> Any:
        # MindSpore keeps the order it is given (group rank i = ranks[i]); only members create
        # the group, the others get its name, which names no group they can use.
        name = _group_name(ranks)
        if self.rank() in ranks:
            comm.create_group(name, list(ranks))
        return name

    def split_group(self, parent: Any, ranks: Sequence[int]) -> Any:
        parent_ranks = self.group_ranks(parent)
        return self.create_group([parent_ranks[r] for r in ranks])

    def _name(self, group: Any) -> Any:
        return comm.GlobalComm.WORLD_COMM_GROUP if group is None else group

    # -- tensors ---------------------------------------------------------------------------
    def describe(self, tensor: Any) -> Optional[Desc]:
        if not isinstance(tensor, ms.Tensor) or self.is_freed(tensor):
            return None
        dtype = _DTYPES.get(tensor.dtype, str(tensor.dtype).lower())
        numel = int(tensor.size)
        device = _device_type(tensor)
        if not tensor.is_contiguous():
            shown = f"tensor of shape {tuple(tensor.shape)} with strides {tuple(tensor.stride())}"
            return (0, numel, dtype, False, device, shown, (0, 0))
        ptr = int(tensor.data_ptr()) if numel else 0
        # MindSpore shows no storage size: the tensor's own bytes bound what the native side
        # touches (a contiguous tensor's data is exactly those).
        storage = (ptr, numel * tensor.itemsize) if ptr else (0, 0)
        return (ptr, numel, dtype, True, device, None, storage)

    def dtype_name(self, dtype: Any) -> Optional[str]:
        if isinstance(dtype, str):
            return dtype
        return _DTYPES.get(dtype)

    def itemsize(self, dtype: Any) -> Optional[int]:
        return dtype.itemsize if dtype in _DTYPES else None

    def scalar(self, value: Any) -> Any:
        if not isinstance(value, ms.Tensor) or value.size != 1 or value.is_floating_point():
            return value  # the caller's check refuses what is not an integer
        return int(value.item())

    def wrap(self, block: Any, shape: Sequence[int], dtype: Any) -> Any:
        ms_dtype = _BY_NAME[block.dtype]
        if block.nbytes == 0:
            return ms.mint.empty(tuple(shape), dtype=ms_dtype)
        words = np.frombuffer(block, dtype=_NUMPY.get(block.dtype, block.dtype)).reshape(tuple(shape))
        tensor = ms.Tensor.from_numpy(words)  # zero-copy; holds `words`, which holds `block`
        return tensor.view(ms_dtype) if block.dtype in _NUMPY else tensor

    def detach_storage(self, tensor: Any) -> None:
        # MindSpore cannot make every op on a tensor raise: the tensor gets empty storage of its
        # own (it no longer reaches the heap, and drops the block) and symm calls refuse it.
        tensor.assign_value(ms.Tensor(np.empty((0,), np.float32)).astype(tensor.dtype))
        tensor._symm_freed = True

    def is_freed(self, tensor: Any) -> bool:
        return bool(getattr(tensor, "_symm_freed", False))

    def device_type(self, tensor: Any) -> str:
        return _device_type(tensor) if isinstance(tensor, ms.Tensor) else "cpu"

    def device_support(self, device: str) -> Optional[str]:
        return (
            f"the mindspore platform serves CPU tensors only ({device} tensors: MindSpore's Ascend "
            "tensors need a device heap MindSpore can allocate from, which symm does not offer yet)"
        )

    def host_work_settler(self) -> Optional[Callable[[], None]]:
        # PyNative queues operations and runs them later: `x.copy_(y); symm.barrier()` would let
        # the peers read the heap before the copy. Its executor's sync completes the queue (what
        # `asnumpy` and `data_ptr` wait for; `mindspore.runtime.synchronize` does not on CPU).
        from mindspore.graph.api import _pynative_executor

        return _pynative_executor.sync

    def future(self) -> Any:
        return concurrent.futures.Future()


def _device_type(tensor: Any) -> str:
    # "CPU", "Ascend:0", "GPU:0": symm's names are torch's ("cpu", "npu").
    device = str(getattr(tensor, "device", "CPU")).split(":")[0].lower()
    return {"ascend": "npu"}.get(device, device)


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _group_name(ranks: Sequence[int]) -> str:
    """A name for the group of these global ranks in this order, the same on every rank."""
    import hashlib

    digest = hashlib.sha1(",".join(map(str, ranks)).encode()).hexdigest()[:12]
    return f"symm_{len(ranks)}_{digest}"


def _all_reduce_ints(values: List[int], group: str) -> List[int]:
    """The element-wise sum over ``group`` of small non-negative integers (below 2**24: exact in
    float32, the dtype MindSpore's CPU AllReduce sums)."""
    summed = ops.AllReduce(group=group)(ms.Tensor(np.asarray(values, np.float32)))
    return [int(v) for v in summed.asnumpy()]


def _open_store(group: str, ranks: Sequence[int], me: int) -> Any:
    """A TCPStore served by ``ranks[0]`` and reached by every member of ``group``.

    The first rank serves it on ``SYMM_STORE_HOST`` (default ``127.0.0.1``: one node) and a port
    it picks; address and port reach the members through an AllReduce on the group."""
    from mindspore.mint.distributed import TCPStore

    first = me == ranks[0]
    message = [0] * 5
    if first:
        host = os.environ.get("SYMM_STORE_HOST", "127.0.0.1").strip() or "127.0.0.1"
        address = socket.gethostbyname(host)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((address, 0))
            port = s.getsockname()[1]
        message = [*map(int, address.split(".")), port]
    shared = _all_reduce_ints(message, group)
    address, port = ".".join(map(str, shared[:4])), shared[4]
    return TCPStore(address, port, len(ranks), is_master=first, timeout=_store_timeout(), wait_for_workers=False)


class _PrefixStore:
    """``store`` under ``prefix``, with the ``wait`` and ``check`` of the c10d protocol, which
    MindSpore's TCPStore lacks: each ``set`` also counts its key in a marker that ``check``
    reads with ``add(marker, 0)``, so presence is known without a blocking ``get``."""

    def __init__(self, store: Any, prefix: str) -> None:
        self._store = store
        self._prefix = prefix

    def set(self, key: str, value: bytes) -> None:
        full = self._prefix + key
        self._store.set(full, value)
        self._store.add(full + "/.set", 1)  # after the value: a marker means the value is there

    def get(self, key: str) -> bytes:
        return self._store.get(self._prefix + key)

    def check(self, keys: List[str]) -> bool:
        return all(self._store.add(self._prefix + k + "/.set", 0) > 0 for k in keys)

    def wait(self, keys: List[str], timeout: datetime.timedelta) -> None:
        deadline = time.monotonic() + timeout.total_seconds()
        nap = 0.0005
        while not self.check(keys):
            if time.monotonic() > deadline:
                raise TimeoutError(f"store keys {keys} not set within {timeout.total_seconds():g} s")
            time.sleep(nap)
            nap = min(nap * 2, 0.05)
