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
from typing import Any, ContextManager, Dict, Hashable, Optional, Sequence, Tuple

import torch
import torch.autograd.profiler as _autograd_profiler
import torch.distributed as dist

from .base import Desc, FastPath, Platform


class TorchPlatform(Platform):
    """PyTorch (``torch.distributed``), CPU tensors."""

    name = "torch"

    def is_initialized(self) -> bool:
        return dist.is_available() and dist.is_initialized()

    def rank(self) -> int:
        return dist.get_rank()

    def world_size(self) -> int:
        return dist.get_world_size()

    def store(self, prefix: str) -> Any:
        # The default group's store is what every rank already rendezvoused through; a private
        # prefix keeps symm's keys apart from torch's own.
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

    def describe(self, tensor: Any) -> Optional[Desc]:
        if not isinstance(tensor, torch.Tensor):
            return None
        dtype = str(tensor.dtype)
        device = tensor.device.type
        if tensor.layout != torch.strided:
            return (0, tensor.numel(), dtype, False, device, f"a {tensor.layout} tensor")
        contiguous = tensor.is_contiguous()
        layout = None
        if not contiguous:
            layout = f"tensor of shape {tuple(tensor.shape)} with strides {tensor.stride()}"
        return (tensor.data_ptr(), tensor.numel(), dtype, contiguous, device, layout)

    def dtype_name(self, dtype: Any) -> Optional[str]:
        if isinstance(dtype, torch.dtype):
            return str(dtype)
        if isinstance(dtype, str):
            return dtype
        return None

    def scalar(self, value: Any) -> Any:
        if (
            isinstance(value, torch.Tensor)
            and value.numel() == 1
            and not value.is_floating_point()
            and not value.is_complex()
        ):
            return int(value.item())
        return value

    def wrap(self, block: Any, shape: Sequence[int], dtype: Any) -> Any:
        torch_dtype = getattr(torch, block.dtype)
        if block.nbytes == 0:
            # Nothing to share (the buffer protocol cannot export zero bytes to torch).
            return torch.empty(tuple(shape), dtype=torch_dtype)
        raw = torch.frombuffer(block, dtype=torch.uint8)
        return raw.view(torch_dtype).view(tuple(shape))

    def detach_storage(self, tensor: Any) -> None:
        with torch.no_grad():
            tensor.set_()

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


#: The functions of torch's stable C shim that the fast path calls (``aoti_torch_<name>``).
_SHIM_FUNCTIONS = ("get_layout", "get_device_type", "get_dtype", "is_contiguous", "get_numel", "get_data_ptr")


def _c_shim(dtype_names: Any) -> Optional[Dict[str, Any]]:
    """torch's stable C shim (``torch/csrc/inductor/aoti_torch/c/shim.h``: the C ABI that
    AOTInductor-compiled code calls, exported by libtorch): the addresses of the functions that
    read a tensor's layout, device, dtype, contiguity, size and address, and the codes they
    give; None when this torch lacks them."""
    try:
        # torch._C's dependencies include libtorch_cpu, where the shim lives; it is loaded already.
        lib = ctypes.CDLL(torch._C.__file__)
        functions = {n: ctypes.cast(getattr(lib, f"aoti_torch_{n}"), ctypes.c_void_p).value for n in _SHIM_FUNCTIONS}

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
        }
    except (OSError, AttributeError):
        return None


def _probes() -> Tuple[Any, ...]:
    """Tensors the shim must read as the descriptors do before the fast path uses it: every
    dtype, views with an offset, non-contiguous and empty tensors, other devices and layouts."""
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
    for extra in ("float8_e4m3fn", "float8_e5m2"):
        if hasattr(torch, extra):
            out.append(torch.zeros(2, dtype=getattr(torch, extra)))
    return tuple(out)
