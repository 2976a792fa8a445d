"""Type stubs of the public ``symm`` API."""

import datetime
from typing import Any, Dict, List, Literal, Optional, Sequence, Tuple, Union

import torch
import torch.distributed

from . import autograd as autograd
from . import functional as functional
from . import library as library
from ._symm import (
    BootstrapError as BootstrapError,
    GroupError as GroupError,
    HeapError as HeapError,
    HeapExhausted as HeapExhausted,
    InvalidArgument as InvalidArgument,
    Mismatch as Mismatch,
    ConcurrentUse as ConcurrentUse,
    DeviceError as DeviceError,
    PeerExited as PeerExited,
    PeerLost as PeerLost,
    PeerRejected as PeerRejected,
    SymmError as SymmError,
    SystemFailure as SystemFailure,
    Timeout as Timeout,
    Unsupported as Unsupported,
    Work as Work,
)

__version__: str
DTYPES: Tuple[str, ...]

#: A process group (``None``: every rank symm was initialised for).
GroupLike = Optional[torch.distributed.ProcessGroup]
#: An element offset, count, rank or value: an int or a one-element integer tensor.
IntLike = Union[int, torch.Tensor]
SignalOp = Union[Literal[0, 1, "set", "add"], int, str]
#: HyperParallel's compare codes: 0 eq, 1 gt, 2 lt, then 3 ne, 4 ge, 5 le (or the names).
CompareOp = Union[Literal[0, 1, 2, 3, 4, 5, "eq", "gt", "lt", "ne", "ge", "le"], int, str]
ReduceOp = Union[Literal[0, 1, 2, 3, "sum", "avg", "max", "min"], int, str]
#: A transport format: torch.float16, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2
#: or their names; "none": full precision; None: SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE.
LowPrecision = Union[None, torch.dtype, str]

def init(group: GroupLike = None) -> None: ...
def is_initialized() -> bool: ...
def empty(
    shape: Union[int, Sequence[int], torch.Size],
    dtype: torch.dtype,
    group: GroupLike = None,
    device: Union[str, torch.device, None] = None,
) -> torch.Tensor: ...
def free(tensor: torch.Tensor) -> None: ...
def is_symmetric(tensor: Any) -> bool: ...
def memory_stats(device: Any = None) -> Dict[str, Any]: ...
def barrier(group: GroupLike = None) -> None: ...
def shmem_put(
    target: torch.Tensor,
    target_offset: IntLike,
    src: torch.Tensor,
    src_offset: IntLike,
    size: IntLike,
    target_rank: IntLike,
    group: GroupLike = None,
    async_op: bool = False,
) -> Optional[Work]: ...
def shmem_get(
    target: torch.Tensor,
    target_offset: IntLike,
    src: torch.Tensor,
    src_offset: IntLike,
    size: IntLike,
    target_rank: IntLike,
    group: GroupLike = None,
    async_op: bool = False,
) -> Optional[Work]: ...
def shmem_signal_op(
    signal: torch.Tensor,
    signal_offset: IntLike,
    signal_value: IntLike,
    signal_op: SignalOp = 0,
    target_rank: IntLike = 0,
    group: GroupLike = None,
) -> None: ...
def shmem_put_with_signal(
    target: torch.Tensor,
    target_offset: IntLike,
    src: torch.Tensor,
    src_offset: IntLike,
    size: IntLike,
    signal: torch.Tensor,
    signal_offset: IntLike,
    signal_value: IntLike,
    signal_op: SignalOp = 0,
    target_rank: IntLike = 0,
    group: GroupLike = None,
    async_op: bool = False,
) -> Optional[Work]: ...
def shmem_wait_for_signal(
    depend_tensor: Optional[torch.Tensor],
    signal: torch.Tensor,
    signal_offset: IntLike,
    compare_value: IntLike,
    compare_op: CompareOp = 0,
    group: GroupLike = None,
    timeout: Union[None, float, datetime.timedelta] = None,
) -> int: ...
def shmem_allreduce(
    tensor: torch.Tensor,
    op: ReduceOp = "sum",
    group: GroupLike = None,
    low_precision_dtype: LowPrecision = None,
    async_op: bool = False,
) -> Optional[Work]: ...
def shmem_reduce_scatter(
    output_tensor: torch.Tensor,
    input_tensor: torch.Tensor,
    op: ReduceOp = "sum",
    group: GroupLike = None,
    low_precision_dtype: LowPrecision = None,
    async_op: bool = False,
) -> Optional[Work]: ...
def shmem_allgather(
    output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: GroupLike = None, async_op: bool = False
) -> Optional[Work]: ...
def shmem_alltoall(
    send_tensor_list: Sequence[torch.Tensor],
    receive_tensor: torch.Tensor,
    receive_list: Union[Sequence[IntLike], torch.Tensor],
    group: GroupLike = None,
    async_op: bool = False,
) -> Optional[Work]: ...
def shmem_broadcast(
    tensor: torch.Tensor, src_rank: IntLike, group: GroupLike = None, async_op: bool = False
) -> Optional[Work]: ...
def shmem_send(
    tensor: torch.Tensor, dst_rank: IntLike, group: GroupLike = None, async_op: bool = False
) -> Union[Work, torch.Tensor, None]: ...  # a tensor (its alias) when it records its backward
def shmem_recv(
    tensor: torch.Tensor, src_rank: IntLike, group: GroupLike = None, async_op: bool = False
) -> Optional[Work]: ...
def shmem_sendrecv(
    send_tensor: torch.Tensor,
    dst_rank: IntLike,
    recv_tensor: torch.Tensor,
    src_rank: IntLike,
    group: GroupLike = None,
    async_op: bool = False,
) -> Optional[Work]: ...
def create_group(ranks: Sequence[int]) -> torch.distributed.ProcessGroup: ...

# Names HyperParallel's (and torch's symmetric-memory) code calls
DEFAULT_SIGNAL_PAD_SIZE: int

class SymmetricMemory:
    buffer: torch.Tensor
    signal_pad: torch.Tensor
    group: GroupLike
    rank: int
    world_size: int
    buffer_size: int
    offset: int
    signal_pad_size: int
    @property
    def buffer_ptrs(self) -> List[int]: ...
    @property
    def signal_pad_ptrs(self) -> List[int]: ...
    def get_buffer(
        self, rank: IntLike, sizes: Union[int, Sequence[int]], dtype: torch.dtype, storage_offset: IntLike = 0
    ) -> torch.Tensor: ...
    def get_signal_pad(
        self,
        rank: IntLike,
        sizes: Union[int, Sequence[int], None] = None,
        dtype: Optional[torch.dtype] = None,
        storage_offset: IntLike = 0,
    ) -> torch.Tensor: ...
    def barrier(self, channel: IntLike = 0, timeout_ms: Optional[IntLike] = None) -> None: ...
    def put_signal(self, dst_rank: IntLike, channel: IntLike = 0, timeout_ms: Optional[IntLike] = None) -> None: ...
    def wait_signal(self, src_rank: IntLike, channel: IntLike = 0, timeout_ms: Optional[IntLike] = None) -> None: ...

def is_shmem_available() -> bool: ...
def rendezvous(tensor: torch.Tensor, group: GroupLike = None) -> SymmetricMemory: ...
def set_signal_pad_size(size: int) -> None: ...
def get_signal_pad_size() -> int: ...
def split_group(parent: GroupLike, ranks: Sequence[int]) -> Union[torch.distributed.ProcessGroup, int]: ...
def stream_event(device: Any = "npu") -> Any: ...
def fused_all_gather_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    gather_out: torch.Tensor,
    signal: Optional[torch.Tensor] = None,
    block_size: Optional[int] = None,
    group: GroupLike = None,
) -> Tuple[torch.Tensor, torch.Tensor]: ...
def fused_matmul_reduce_scatter(
    x1: torch.Tensor,
    x2: torch.Tensor,
    symm_tensor: Optional[torch.Tensor] = None,
    signal: Optional[torch.Tensor] = None,
    reduce_op: str = "sum",
    block_size: Optional[int] = None,
    group: GroupLike = None,
) -> torch.Tensor: ...

__all__: list[str]

# Diagnostics
def set_log_level(level: Union[str, int, None]) -> None: ...
def get_log_level() -> str: ...
def stats() -> List[Dict[str, Any]]: ...
def reset_stats() -> None: ...
def dump() -> str: ...
def flight_records() -> List[Dict[str, Any]]: ...
def install_dump_on_signal() -> None: ...
