"""The PyTorch platform: ``torch.distributed`` for the job and its groups, CPU tensors for data.

- Rank and world size come from the default process group (``init_process_group``, e.g. under
  ``torchrun``, with any backend; ``gloo`` on CPU).
- The store is the default process group's store (``TCPStore`` or ``FileStore``) under a
  ``PrefixStore``, so symm's keys never meet the framework's.
- Groups are ``ProcessGroup`` objects: from ``new_group``, ``split_group`` or a ``DeviceMesh``
  dimension (``mesh.get_group(dim)``); ``get_process_group_ranks`` gives their global ranks.
- Tensors are described by address, element count, dtype, contiguity and device; heap blocks
  become tensors through the buffer protocol (``torch.frombuffer``), which keeps the block alive
  for as long as any view of the tensor exists.
"""

from __future__ import annotations

import ctypes
import datetime
import time
from typing import Any, ContextManager, Dict, Hashable, Optional, Sequence, Tuple

import torch
import torch.autograd.profiler as _autograd_profiler
import torch.distributed as dist

from .base import Desc, FastPath, OtherLibraryGuard, Platform


class FreedTensor(torch.Tensor):
    """What ``symm.free`` turns a symmetric tensor into: its storage is gone (shape ``(0,)``) and
    every torch operation on it raises, instead of reading or writing memory that belongs to the
    heap again; symm calls refuse it as ``InvalidArgument`` naming the argument. ``repr`` and
    ``isinstance`` still work, and it is garbage-collected as usual."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = getattr(func, "__name__", repr(func))
        raise RuntimeError(
            f"symm: this tensor was released by symm.free() and cannot be used ({name}); its memory "
            f"belongs to the symmetric heap again: allocate a new tensor with symm.empty()"
        )

    def __repr__(self) -> str:  # type: ignore[override]
        return "FreedTensor(released by symm.free())"


class TorchPlatform(Platform):
    """PyTorch (``torch.distributed``), CPU tensors."""

    name = "torch"
    how_to_start = "call torch.distributed.init_process_group first, or run under torchrun"

    def is_initialized(self) -> bool:
        return dist.is_available() and dist.is_initialized()

    def rank(self) -> int:
        return dist.get_rank()

    def world_size(self) -> int:
        return dist.get_world_size()

    def store(self, prefix: str, group: Any = None) -> Any:
        # The default group's store, which every rank already rendezvoused through, serves every
        # group; a private prefix keeps symm's keys apart from torch's own.
        return dist.PrefixStore(prefix, dist.distributed_c10d._get_default_store())

    def share_secret(self, group: Any, ranks: Sequence[int]) -> Optional[bytes]:
        # Over the process group's connections, which the ranks set up through the store before
        # symm starts: whoever can read or write the store afterwards never sees the secret.
        # A plain uint8 tensor (broadcast_object_list needs numpy on the receivers).
        import secrets

        if self.rank() == ranks[0]:
            buf = torch.tensor(list(secrets.token_bytes(32)), dtype=torch.uint8)
        else:
            buf = torch.zeros(32, dtype=torch.uint8)
        dist.broadcast(buf, src=ranks[0], group=group)
        return bytes(buf.tolist()).hex().encode()

    def group_key(self, group: Any) -> Hashable:
        # ProcessGroup objects hash by identity: one entry per group object.
        return group

    def group_ranks(self, group: Any) -> Sequence[int]:
        if group is dist.GroupMember.NON_GROUP_MEMBER:
            raise LookupError("this rank is not a member of the group (torch gave it NON_GROUP_MEMBER)")
        if not isinstance(group, dist.ProcessGroup):
            raise LookupError(f"expected a torch.distributed.ProcessGroup, got {type(group).__name__}")
        try:
            return dist.get_process_group_ranks(group)
        except (KeyError, ValueError, RuntimeError) as e:
            raise LookupError(f"torch.distributed does not know this process group ({e})") from e

    def create_group(self, ranks: Sequence[int]) -> Any:
        # sort_ranks=False: the group keeps the caller's order (group rank i = ranks[i]).
        return dist.new_group(list(ranks), sort_ranks=False)

    def split_group(self, parent: Any, ranks: Sequence[int]) -> Any:
        # torch's own split (every member of the parent calls it; the order of `ranks` is the
        # new group's order; members outside `ranks` get NON_GROUP_MEMBER). Creating the group
        # with new_group(use_local_synchronization=True) instead would let non-members skip the
        # call, but leaves torch's later group creations (a DeviceMesh) hanging under gloo.
        split = getattr(dist, "split_group", None)
        if split is None:
            from .._symm import Unsupported

            raise Unsupported(
                f"split_group needs torch.distributed.split_group (torch >= 2.6); this is {torch.__version__}"
            )
        return split(parent, [list(ranks)])

    # -- messages between nodes: bytes over torch.distributed (gloo moves every dtype's bytes
    # as uint8; symm reduces them itself). A group whose backend is symm's ("symm", symm/c10d.py)
    # cannot carry them (its send would come back into symm): its private Gloo group does. ------
    def inter_isend(self, tensor: Any, dst: int, group: Any) -> Any:
        own = _transport(group)
        if own is not None:
            return own[0].send([_bytes(tensor)], dst, HIER_TAG)
        return dist.isend(_bytes(tensor), dst=_global(group, dst), group=_not_symm(group))

    def inter_irecv(self, tensor: Any, src: int, group: Any) -> Any:
        own = _transport(group)
        if own is not None:
            return own[0].recv([_bytes(tensor)], src, HIER_TAG)
        return dist.irecv(_bytes(tensor), src=_global(group, src), group=_not_symm(group))

    def inter_wait(self, handles: Sequence[Any], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for work in handles:
            work.wait(datetime.timedelta(seconds=max(deadline - time.monotonic(), 0.001)))

    def inter_barrier(self, group: Any) -> None:
        own = _transport(group)
        if own is not None:
            # Bounded by the process group's timeout, as dist.barrier on the group would be.
            own[0].barrier(dist.BarrierOptions()).wait(own[1])
            return
        dist.barrier(group=_not_symm(group))

    def flat(self, tensor: Any) -> Any:
        return tensor.view(-1)

    def narrow(self, flat: Any, start: int, numel: int) -> Any:
        return flat.narrow(0, start, numel)

    def scratch(self, like: Any, numel: int) -> Any:
        return torch.zeros(numel, dtype=like.dtype, device=like.device)

    def int_tensor(self, values: Sequence[int]) -> Any:
        return torch.tensor(list(values), dtype=torch.int64)

    def copy_into(self, dst: Any, src: Any) -> None:
        with torch.no_grad():
            dst.copy_(src)

    def reduce_into(self, out: Any, parts: Sequence[Any], op: str, divisor: int) -> None:
        with torch.no_grad():
            if out.dtype == torch.bool or op in ("max", "min"):
                # Exact in any dtype (torch's maximum/minimum keep NaN); bool: "any" or "all".
                if out.dtype == torch.bool:
                    fold = torch.logical_and if op == "min" else torch.logical_or
                else:
                    fold = torch.maximum if op == "max" else torch.minimum
                acc = parts[0].clone()
                for p in parts[1:]:
                    fold(acc, p, out=acc)
                out.copy_(acc)
                return
            # symm's accumulator: f32 for 16-bit and 8-bit floats, the dtype itself otherwise.
            wide = out.dtype if out.dtype in (torch.float32, torch.float64) or not out.is_floating_point() else None
            acc = parts[0].to(wide or torch.float32, copy=True)
            for p in parts[1:]:
                acc.add_(p.to(acc.dtype) if wide is None else p)
            if op == "avg":
                acc.div_(divisor)
            out.copy_(acc)

    def describe(self, tensor: Any) -> Optional[Desc]:
        if not isinstance(tensor, torch.Tensor) or isinstance(tensor, FreedTensor):
            return None
        # Read what the C++ tensor holds, not what Python says of it: with torch functions off,
        # the base class's own descriptors run (a subclass's numel() or data_ptr() overrides and
        # its __torch_function__, or a TorchFunctionMode, cannot change what is read), and the
        # storage's address and size bound the memory the native side will touch.
        with torch._C.DisableTorchFunction():
            dtype = str(_BASE.dtype.__get__(tensor))
            device = _BASE.device.__get__(tensor).type
            layout = _BASE.layout.__get__(tensor)
            numel = _BASE.numel(tensor)
            if layout != torch.strided:
                return (0, numel, dtype, False, device, f"a {layout} tensor", (0, 0))
            contiguous = _BASE.is_contiguous(tensor)
            shown = None
            if not contiguous:
                shown = f"tensor of shape {tuple(_BASE.size(tensor))} with strides {_BASE.stride(tensor)}"
            storage = _storage(tensor)
            # No memory behind the storage: the tensor's own address is not read (a FakeTensor
            # warns when it is, and future torch raises).
            ptr = _BASE.data_ptr(tensor) if storage[0] else 0
            return (ptr, numel, dtype, contiguous, device, shown, storage)

    def dtype_name(self, dtype: Any) -> Optional[str]:
        if isinstance(dtype, torch.dtype):
            return str(dtype)
        if isinstance(dtype, str):
            return dtype
        return None

    def scalar(self, value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        with torch._C.DisableTorchFunction():
            if _BASE.numel(value) != 1 or _BASE.is_floating_point(value) or _BASE.is_complex(value):
                return value  # the caller's check refuses it (without reading its data)
            if _BASE.device.__get__(value).type == "cpu" and not _readable(self.describe(value), value):
                # torch would read past the storage (or raise): refused by the caller's check,
                # which names the argument, as any value that is not an integer.
                return _NoData(value)
            try:
                return int(_BASE.item(value))
            except (RuntimeError, NotImplementedError):  # no data on its device (a meta tensor)
                return _NoData(value)

    def wrap(self, block: Any, shape: Sequence[int], dtype: Any) -> Any:
        torch_dtype = getattr(torch, block.dtype)
        if block.nbytes == 0:
            # Nothing to share (the buffer protocol cannot export zero bytes to torch).
            return torch.empty(tuple(shape), dtype=torch_dtype)
        raw = torch.frombuffer(block, dtype=torch.uint8)
        # A tensor on that storage, not a view of `raw`: a view carries autograd metadata, past
        # which the fast path must ask whether the tensor requires grad (tensor.rs, `Grad`).
        out = torch.empty(0, dtype=torch_dtype)
        with torch.no_grad():
            out.set_(raw.untyped_storage(), 0, tuple(shape))
        return out

    def itemsize(self, dtype: Any) -> Optional[int]:
        return dtype.itemsize if isinstance(dtype, torch.dtype) else None

    def wrap_peer(self, view: Any, shape: Sequence[int], dtype: Any, storage_offset: int) -> Any:
        # The storage is the member's whole copy (its deleter holds `view`); the tensor starts
        # `storage_offset` elements in, as torch's own get_buffer places it.
        storage = torch.frombuffer(view, dtype=torch.uint8).untyped_storage()
        out = torch.empty(0, dtype=dtype)
        with torch.no_grad():
            out.set_(storage, storage_offset, tuple(shape))
        return out

    def device_type(self, tensor: Any) -> str:
        # The base class's descriptor (not a subclass's override), without describing the rest.
        if not isinstance(tensor, torch.Tensor) or isinstance(tensor, FreedTensor):
            return "cpu"
        return _BASE.device.__get__(tensor).type

    # -- npu tensors (torch_npu): not run on this project's machines, see docs/ascend.md -------
    def device_support(self, device: str) -> Optional[str]:
        if device != "npu":
            return f"the torch platform serves cpu and npu tensors, not {device}"
        try:
            import torch_npu  # noqa: F401 - registers torch.npu
        except Exception as e:  # noqa: BLE001 - any failure to load says the same
            return (
                f"npu tensors need torch_npu and the CANN toolkit (import torch_npu failed: {type(e).__name__}: "
                f"{e}); see docs/ascend.md"
            )
        return None

    def current_device(self, device: str) -> int:
        return int(torch.npu.current_device())  # type: ignore[attr-defined]

    def current_stream(self, device: str) -> int:
        # `npu_stream` is the aclrtStream's address; reading it also submits the work torch_npu
        # queued for the stream, so that symm's work lands after it (0 if that failed: the
        # native side refuses it).
        return int(torch.npu.current_stream().npu_stream)  # type: ignore[attr-defined]

    def record_event(self, device: str) -> Any:
        return torch.npu.current_stream().record_event()  # type: ignore[attr-defined]

    # The streams symm.mc2 orders its pipelined calls on (its ``_StreamOrder``), as torch_npu's
    # objects: the streams' own ``wait_stream``, ``record_event`` and ``wait_event`` do the rest.
    def caller_stream(self, device: torch.device) -> Any:
        """The caller's current stream of ``device``."""
        return torch.npu.current_stream(device)  # type: ignore[attr-defined]

    def side_stream(self, device: torch.device) -> Any:
        """A second stream of ``device``, made on first use and kept (one per device)."""
        stream = _SIDE_STREAMS.get(device)
        if stream is None:
            stream = _SIDE_STREAMS[device] = torch.npu.Stream(device=device)  # type: ignore[attr-defined]
        return stream

    def using_stream(self, stream: Any) -> ContextManager[Any]:
        """``stream`` as the current stream for the block (symm's npu calls run on it)."""
        return torch.npu.stream(stream)  # type: ignore[attr-defined]

    def wrap_device(self, block: Any, shape: Sequence[int], dtype: Any) -> Any:
        import torch_npu

        torch_dtype = getattr(torch, block.dtype)
        device = torch.device("npu", self.current_device("npu"))
        dims = tuple(shape)
        if block.nbytes == 0:
            return torch.empty(dims, dtype=torch_dtype, device=device)
        # torch_npu's own constructors of a tensor over memory it did not allocate (what Ascend
        # SHMEM's Python package uses): a storage that does not own the memory, then the tensor.
        storage = torch_npu._C._construct_storage_from_data_pointer(block.ptr, device, block.nbytes)
        meta = {
            "data_ptr": block.ptr,
            "device": device,
            "nbytes": block.nbytes,
            "dtype": torch_dtype,
            "size": dims,
            "stride": torch.empty(dims, device="meta").stride(),  # contiguous, nothing allocated
            "storage_offset": 0,
        }
        return torch_npu._C._construct_NPU_Tensor_From_Storage_And_Metadata(meta, storage)

    def detach_storage(self, tensor: Any) -> None:
        with torch.no_grad():
            tensor.set_()
        # Every torch op on it now raises (FreedTensor.__torch_function__), and it is no longer
        # of a type the native fast path reads, so symm calls reach the check in `_desc`.
        tensor.__class__ = FreedTensor

    def is_freed(self, tensor: Any) -> bool:
        return isinstance(tensor, FreedTensor)

    def guard_other_library(self, guard: OtherLibraryGuard) -> bool:
        from . import torch_guard

        torch_guard.install(guard)
        return True

    def fast_path(self) -> Optional[FastPath]:
        # Every torch dtype object by identity; the native side keeps those it supports.
        dtypes = {d: str(d) for d in vars(torch).values() if isinstance(d, torch.dtype)}
        return FastPath(
            tensor_types=(torch.Tensor, torch.nn.Parameter),
            dtypes=dtypes,
            profiler=(vars(_autograd_profiler), "_is_profiler_enabled"),
            groups_by_identity=True,  # group_key(group) is group
            shim=_c_shim(dtypes.values()),
            probes=_probes(),
        )

    def profiling(self) -> bool:
        # A module global that torch.profiler.profile and torch.autograd.profiler.profile set
        # while they record: one attribute load, no call into C++.
        return bool(_autograd_profiler._is_profiler_enabled)

    def record_function(self, name: str) -> ContextManager[Any]:
        return torch.profiler.record_function(name)

    def future(self) -> Any:
        return torch.futures.Future()


#: torch's tensor base class, whose descriptors read the C++ tensor (see ``describe``).
_BASE = torch._C.TensorBase

#: The side stream of each npu device (``TorchPlatform.side_stream``).
_SIDE_STREAMS: Dict[torch.device, Any] = {}


def _bytes(tensor: Any) -> Any:
    """The bytes of a contiguous tensor, as a uint8 tensor over the same memory."""
    return tensor.view(-1).view(torch.uint8)


#: The Gloo tag (slot) of symm.hier's messages on a private transport; the "symm" backend's own
#: point-to-point messages between hosts use P2P_TAG, so that neither stream overtakes the other.
HIER_TAG = 0
P2P_TAG = 1

#: The private Gloo group (and its timeout) of each process group whose backend is symm's and
#: whose members lie on several hosts, by group key (None: the default group, when it is
#: symm's). symm/c10d.py makes it where every member takes part (the backend's creation).
_TRANSPORTS: Dict[Any, Tuple[Any, datetime.timedelta]] = {}


def set_transport(group: Any, pg: Any, timeout: datetime.timedelta) -> None:
    """Registers ``pg`` (a ``ProcessGroupGloo`` of the same members, in the same order) as the
    transport between nodes of ``group`` (None: the default group)."""
    _TRANSPORTS[group] = (pg, timeout)


def drop_transport(group: Any) -> None:
    _TRANSPORTS.pop(group, None)


def _transport(group: Any) -> Optional[Tuple[Any, datetime.timedelta]]:
    if not _TRANSPORTS:
        return None
    own = _TRANSPORTS.get(group)
    # The default group reaches symm as None or as its ProcessGroup object.
    if own is None and group is not None and group is dist.group.WORLD:
        own = _TRANSPORTS.get(None)
    return own


def _not_symm(group: Any) -> Any:
    """``group``, refused when its backend is symm's: its messages would come back into symm
    (recursion), and it has no private transport (the backend makes one for every group whose
    members lie on several hosts, so this is a group torch built some other way)."""
    name = str(dist.get_backend(group))  # "symm", or "cpu:symm" among several
    if any(b.rpartition(":")[2] == "symm" for b in name.split(",")):
        from .._symm import Unsupported

        raise Unsupported(
            "messages between hosts on a process group whose backend is 'symm' need the private Gloo group "
            "symm's backend makes when it creates a group spanning hosts; this group has none (torch built "
            "it without symm's backend factory): create it with new_group(ranks, backend='symm')"
        )
    return group


def _global(group: Any, rank: int) -> int:
    """The global rank of ``rank`` of ``group`` (``None``: the whole job)."""
    return rank if group is None else dist.get_global_rank(group, rank)


def _storage(tensor: Any) -> Tuple[int, int]:
    """``(address, bytes)`` of the storage ``tensor``'s data lies in; ``(0, 0)`` when it has none
    that holds memory: a meta storage (a FakeTensor's: its address is not read, which warns),
    a wrapper subclass's (which raises when read), storage freed with ``resize_(0)``."""
    try:
        storage = _BASE.untyped_storage(tensor)
        if storage.device.type == "meta":
            return (0, 0)
        ptr = storage.data_ptr()
        return (ptr, storage.nbytes()) if ptr else (0, 0)
    except (RuntimeError, NotImplementedError, TypeError):
        return (0, 0)


def _readable(d: Optional[Desc], tensor: Any) -> bool:
    """Whether the one element of ``tensor`` (described as ``d``) lies within its storage."""
    if d is None:
        return False
    ptr, (base, nbytes) = d[0], d[6]
    return ptr != 0 and base <= ptr and ptr + _BASE.element_size(tensor) <= base + nbytes


class _NoData:
    """Stands in for a one-element tensor given as a value (an offset, a size, a rank, a code)
    whose element cannot be read: what the native side shows when it refuses it."""

    def __init__(self, tensor: Any) -> None:
        self.text = f"<a one-element {type(tensor).__name__} without data to read>"

    def __repr__(self) -> str:
        return self.text


def _c_shim(dtype_names: Any) -> Optional[Dict[str, Any]]:
    """torch's stable C shim (``torch/csrc/inductor/aoti_torch/c/shim.h``: the C ABI that
    AOTInductor-compiled code calls, exported by libtorch): the addresses of the functions that
    read a tensor's layout, device, dtype, contiguity, size, address, storage offset and storage
    size, and the codes they give; None when this torch lacks them."""
    try:
        # torch._C's dependencies include libtorch_cpu, where the shim lives; it is loaded already.
        lib = ctypes.CDLL(torch._C.__file__)
        # The ones the fast path calls, as the native module names them (``aoti_torch_<name>``).
        from .._symm import SHIM_FUNCTIONS

        functions = {n: ctypes.cast(getattr(lib, f"aoti_torch_{n}"), ctypes.c_void_p).value for n in SHIM_FUNCTIONS}

        def code(name: str) -> int:
            fn = getattr(lib, f"aoti_torch_{name}")
            fn.restype, fn.argtypes = ctypes.c_int32, []
            return int(fn())

        dtypes = {}
        for full in dtype_names:
            name = full.rpartition(".")[2]
            if hasattr(lib, f"aoti_torch_dtype_{name}"):
                dtypes[code(f"dtype_{name}")] = name
        return {
            "functions": functions,
            "strided": code("layout_strided"),
            "cpu": code("device_type_cpu"),
            "dtypes": dtypes,
            # torch's tensor objects (THPVariable) hold their at::Tensor inline: the fast path
            # may find where by probing, and then reads no attribute per call.
            "tensor_in_object": True,
            # A call whose tensor requires grad in grad mode records its backward (the full
            # path): the fast path asks grad mode, and finds where a TensorImpl keeps its
            # autograd metadata (null: the tensor cannot require grad) by these probes.
            "grad_mode": _address(lib, "aoti_torch_grad_mode_is_enabled"),
            "grad_probes": _grad_probes(),
        }
    except (OSError, AttributeError):
        return None


def _address(lib: Any, name: str) -> int:
    """The address of ``name`` in ``lib``, 0 when it has none."""
    fn = getattr(lib, name, None)
    return 0 if fn is None else int(ctypes.cast(fn, ctypes.c_void_p).value or 0)


def _grad_probes() -> Tuple[Tuple[Any, ...], Tuple[Any, ...]]:
    """Tensors without autograd metadata (made by factories with grad mode off), and tensors
    that require grad (a leaf, a result, a parameter)."""
    with torch.no_grad():
        plain = (torch.zeros(3), torch.ones(2, 3, dtype=torch.float64), torch.empty(0, dtype=torch.int64))
    leaf = torch.ones(3, requires_grad=True)
    with torch.enable_grad():
        with_grad = (leaf, leaf * 2, torch.nn.Parameter(torch.ones(2)))
    return plain, with_grad


def _probes() -> Tuple[Any, ...]:
    """Tensors the shim must read as the descriptors do before the fast path uses it: every
    dtype, views with an offset, non-contiguous and empty tensors, other devices and layouts,
    tensors without real storage (freed with ``resize_(0)``) and a view past its shrunk storage
    (which both must refuse)."""
    base = torch.arange(24, dtype=torch.float64)
    out = [
        torch.zeros(3, dtype=d)
        for d in (
            torch.float32,
            torch.float16,
            torch.bfloat16,
            torch.int8,
            torch.int16,
            torch.int32,
            torch.int64,
            torch.uint8,
            torch.bool,
        )
    ]
    out += [base, base[5:17], base.view(4, 6).t(), base.view(4, 6)[1], torch.empty(0), torch.ones(2, 3)[:, 1:]]
    out += [torch.nn.Parameter(torch.ones(4)), torch.ones(2, 2).to_sparse(), torch.ones(3, device="meta")]
    freed = torch.ones(5)
    freed.untyped_storage().resize_(0)
    shrunk = torch.ones(8)
    past = shrunk[4:]
    shrunk.untyped_storage().resize_(8)
    out += [freed, past]
    for extra in ("float8_e4m3fn", "float8_e5m2"):
        if hasattr(torch, extra):
            out.append(torch.zeros(2, dtype=getattr(torch, extra)))
    return tuple(out)
