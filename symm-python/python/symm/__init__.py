"""symm: symmetric memory for the ranks of one node, with one-sided communication.

Every rank owns a heap with the same layout; ``empty`` allocates the same range on every member
of a group, and any member reads and writes the others' copies directly::

    import torch, torch.distributed as dist, symm
    dist.init_process_group("gloo")                   # e.g. under torchrun
    rank, n = dist.get_rank(), dist.get_world_size()
    buf = symm.empty((n, 1024), torch.bfloat16)       # collective; a zero-copy torch tensor
    sig = symm.empty(n, torch.int32)
    sig.zero_()
    symm.barrier()
    src = torch.randn(1024).to(torch.bfloat16)
    # write row `rank` of the next rank's buffer, then set its signal word `rank` to 1
    symm.shmem_put_with_signal(buf, rank * 1024, src, 0, 1024, sig, rank, 1, "set", (rank + 1) % n)
    symm.shmem_wait_for_signal(buf, sig, (rank - 1) % n, 1, "eq")   # row rank-1 has arrived

Collectives (``shmem_allreduce``, ``shmem_reduce_scatter``, ``shmem_allgather``,
``shmem_alltoall``, ``shmem_broadcast``) and messages (``shmem_send``, ``shmem_recv``,
``shmem_sendrecv``) take any contiguous CPU tensor. With ``async_op=True`` a collective, a
``shmem_put``, ``shmem_get`` or ``shmem_put_with_signal`` returns a ``symm.Work`` at once
(``wait``, ``is_completed``, ``get_future``, as ``torch.distributed``'s); its tensors belong to
the operation until it has completed. Their differentiable forms are in
``symm.functional`` (PyTorch and MindSpore tensors), and ``python -m symm.perf`` measures them against
``torch.distributed`` (gloo).

Offsets and sizes count elements. ``target_rank`` is a rank of ``group`` (global when ``group``
is None). Every blocking call is bounded by ``SYMMETRIC_MEMORY_TIMEOUT`` and releases the GIL.
Errors are ``SymmError`` subclasses carrying a stable ``code`` and the ``rank`` that raised them.
Diagnostics: the core logs into the ``symm`` logger (``SYMM_LOG_LEVEL``, ``set_log_level``);
``stats``, ``reset_stats``, ``dump``, ``flight_records``, ``install_dump_on_signal``; every call
shows up in ``torch.profiler`` as ``symm::<op>(<numel> x <dtype>, group=...)``.
"""

from . import _symm
from ._symm import (
    DTYPES,
    BootstrapError,
    GroupError,
    HeapError,
    HeapExhausted,
    InvalidArgument,
    Mismatch,
    ConcurrentUse,
    DeviceError,
    PeerExited,
    PeerLost,
    PeerRejected,
    SymmError,
    SystemFailure,
    Timeout,
    Unsupported,
    Work,
    __version__,
)
from ._diag import (
    dump,
    flight_records,
    get_log_level,
    install_dump_on_signal,
    reset_stats,
    set_log_level,
    stats,
)
from ._api import (
    DEFAULT_SIGNAL_PAD_SIZE,
    SymmetricMemory,
    barrier,
    create_group,
    empty,
    free,
    get_signal_pad_size,
    init,
    is_initialized,
    is_shmem_available,
    is_symmetric,
    memory_stats,
    rendezvous,
    set_signal_pad_size,
    shmem_get,
    shmem_put,
    shmem_put_with_signal,
    shmem_signal_op,
    shmem_wait_for_signal,
    split_group,
    stream_event,
)

__all__ = [
    "DEFAULT_SIGNAL_PAD_SIZE",
    "DTYPES",
    "BootstrapError",
    "GroupError",
    "HeapError",
    "HeapExhausted",
    "InvalidArgument",
    "Mismatch",
    "ConcurrentUse",
    "DeviceError",
    "PeerExited",
    "PeerLost",
    "PeerRejected",
    "SymmError",
    "SymmetricMemory",
    "SystemFailure",
    "Timeout",
    "Unsupported",
    "Work",
    "__version__",
    "barrier",
    "create_group",
    "dump",
    "empty",
    "flight_records",
    "free",
    "get_log_level",
    "get_signal_pad_size",
    "init",
    "install_dump_on_signal",
    "is_initialized",
    "is_shmem_available",
    "is_symmetric",
    "memory_stats",
    "rendezvous",
    "reset_stats",
    "set_log_level",
    "set_signal_pad_size",
    "shmem_get",
    "shmem_put",
    "shmem_put_with_signal",
    "shmem_signal_op",
    "shmem_wait_for_signal",
    "split_group",
    "stats",
    "stream_event",
]

# The public collectives: one per row of the native table (src/ops.rs).
globals().update({name: getattr(_symm, name) for name, *_ in _symm.COLLECTIVES})
__all__ += [name for name, *_ in _symm.COLLECTIVES]


#: HyperParallel's MC2 fused operators (``symm.mc2``), loaded with it on first use.
_MC2 = ("fused_all_gather_matmul", "fused_matmul_reduce_scatter")
__all__ += list(_MC2)


def __getattr__(name: str) -> object:
    # The PyTorch-only modules load on first use.
    import importlib

    if name in ("autograd", "ddp", "functional", "library", "mc2"):
        return importlib.import_module(f".{name}", __name__)
    if name in _MC2:
        return getattr(importlib.import_module(".mc2", __name__), name)
    raise AttributeError(f"module 'symm' has no attribute {name!r}")


def _register_torch_backend() -> None:
    # torch.distributed's backend "symm" (symm/c10d.py) and the CPU kernels of PyTorch's MC2
    # operators (torch.ops.symm_mem, symm/mc2.py), registered at import when torch is
    # installed; without torch, `import symm` imports no framework, as before.
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        from . import c10d, mc2

        c10d.register()
        mc2.register_torch_ops()


_register_torch_backend()
