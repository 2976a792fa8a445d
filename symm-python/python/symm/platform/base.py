"""The platform contract: what symm needs from a deep-learning framework.

A platform supplies the job (rank, world size, a key-value store), its process groups (create,
split, list the members) and its tensors (describe one for the native module, wrap a heap
block as one). The public API (``symm.empty``, ``symm.shmem_put`` ...) only talks to this
class, so adding a framework means adding a subclass, not changing the API.

Groups are whatever the framework uses: a ``ProcessGroup`` object for PyTorch, a group name
(``str``) for MindSpore. ``None`` always means the whole job.
"""

from __future__ import annotations

import abc
import contextlib
from typing import Any, Callable, ContextManager, Dict, Hashable, List, NamedTuple, Optional, Sequence, Tuple

# (data_ptr, numel, dtype name, is_contiguous, device type, layout shown in errors or None,
#  (storage address, storage bytes)): the storage is the memory the tensor's data lies in, as the
# framework allocated it, read from the framework's own tensor (not from methods a subclass may
# override); (0, 0) when the tensor has no real storage. The native side moves data only within it.
Desc = Tuple[int, int, str, bool, str, Optional[str], Tuple[int, int]]


class FastPath(NamedTuple):
    """What the native fast path of the small collectives needs to read a platform's tensors
    without ``describe`` (see ``Platform.fast_path``).

    The fast path reads a tensor of one of ``tensor_types`` (exact type) through torch's stable
    C shim when ``shim`` is given and reads every one of ``probes`` right, else through the
    torch-style interface: ``dtype``, ``is_cpu``, ``is_contiguous()``, ``numel()``,
    ``data_ptr()``, calling the C functions behind the type's descriptors. Anything unusual
    (another type, dtype, device or layout, no contiguous storage) makes the call take the full
    path.
    """

    #: Tensor types read directly (subclasses not listed take the full path).
    tensor_types: Tuple[type, ...]
    #: The framework's dtype objects and their names (as ``dtype_name`` gives them).
    dtypes: Dict[Any, str]
    #: ``(mapping, key)`` whose value is true while the profiler records (a module's
    #: ``vars()`` and the name of its flag), or None.
    profiler: Optional[Tuple[Dict[str, Any], str]]
    #: Whether ``group_key(group)`` is ``group`` itself (the fast path then finds cached groups).
    groups_by_identity: bool
    #: torch's stable C shim, or None: ``{"functions": {name: address}, "strided": code,
    #: "cpu": code, "dtypes": {code: dtype name}, "tensor_in_object": bool}`` (see
    #: ``Communicator.enable_fast_path``; ``tensor_in_object``: the tensor objects hold their
    #: ``at::Tensor`` inline, as torch's do, so the fast path may read it in place).
    shim: Optional[Dict[str, Any]] = None
    #: Tensors of every kind to tell apart (dtypes, views, devices, layouts): the shim is used
    #: only when it reads each of them as the descriptors do.
    probes: Tuple[Any, ...] = ()


class OtherLibraryGuard(NamedTuple):
    """What ``Platform.guard_other_library`` calls around the other library's operations."""

    #: ``clash(storage address, storage bytes)``: how symm's operation in flight on that memory
    #: is shown, or None.
    clash: Callable[[int, int], Optional[str]]
    #: ``started(library, op, work, [(shown, storage address, storage bytes)])``: registers the
    #: other library's asynchronous operation until ``work.is_completed()``.
    started: Callable[[str, str, Any, List[Tuple[str, int, int]]], None]
    #: ``refuse(arg, shown, reason)``: the exception a refused call raises (``InvalidArgument``).
    refuse: Callable[[str, str, str], Exception]


class Platform(abc.ABC):
    """A deep-learning framework as symm sees it."""

    #: Short name shown in messages (``"torch"``, ``"mindspore"``).
    name: str = "?"
    #: What a job does to start the framework's distributed runtime (shown when it has not).
    how_to_start: str = "start the framework's distributed runtime first"

    # -- the job ---------------------------------------------------------------------------
    @abc.abstractmethod
    def is_initialized(self) -> bool:
        """Whether the framework's distributed runtime is up (ranks and store are known)."""

    @abc.abstractmethod
    def rank(self) -> int:
        """This process's global rank."""

    @abc.abstractmethod
    def world_size(self) -> int:
        """Number of processes in the job."""

    @abc.abstractmethod
    def store(self, prefix: str, group: Any = None) -> Any:
        """A key-value store shared by every rank of ``group`` (``None``: the job), with keys under
        ``prefix``. Collective over ``group`` (symm's start-up calls it on every member).

        The object speaks the c10d protocol: ``set(key, value: bytes)``, ``get(key) -> bytes``
        and ``wait(keys, timeout: datetime.timedelta)`` (raises once the timeout passes).
        """

    def share_secret(self, group: Any, ranks: Sequence[int]) -> Optional[bytes]:
        """A fresh random secret, the same on every rank of ``ranks`` (``group``), carried over
        the framework's own connections (never through the store). Collective. ``None``: the
        framework cannot (the start-up records then go unauthenticated, unless
        ``SYMM_JOB_SECRET`` is set)."""
        return None

    # -- groups ----------------------------------------------------------------------------
    @abc.abstractmethod
    def group_key(self, group: Any) -> Hashable:
        """A hashable identity of ``group`` (not None), to cache what symm builds for it."""

    @abc.abstractmethod
    def group_ranks(self, group: Any) -> Sequence[int]:
        """The global ranks of ``group``, in group-rank order.

        Raises ``LookupError`` when this process cannot see the group's members (it is not a
        member and the framework keeps no member list for it).
        """

    @abc.abstractmethod
    def create_group(self, ranks: Sequence[int]) -> Any:
        """A new group of these global ranks, in this order (collective as the framework's
        own group creation is)."""

    @abc.abstractmethod
    def split_group(self, parent: Any, ranks: Sequence[int]) -> Any:
        """A new group of the members ``ranks`` of ``parent`` (ranks of ``parent``, in the new
        group's order). Every member of ``parent`` calls it with the same ``ranks``; the
        others get the framework's non-member value."""

    # -- messages between nodes (symm.hier) -------------------------------------------------
    # A group whose members lie on several hosts runs its collectives hierarchically: symm
    # inside each node, messages of the framework between nodes, on the caller's own group
    # (making dedicated groups would be collective over the whole job in most frameworks, which
    # a call on a sub-group cannot ask). Tensors are 1-D and contiguous, of any dtype symm
    # moves: the messages carry their bytes (symm reduces them itself, in a fixed order). Ranks
    # are ranks of ``group`` (``None``: the whole job). A platform without them serves groups
    # inside one node only.

    def inter_isend(self, tensor: Any, dst: int, group: Any) -> Any:
        """Starts sending ``tensor`` to rank ``dst`` of ``group``; returns a handle for
        ``inter_wait``. Messages between two ranks arrive in the order they were started."""
        raise self._no_inter("send")

    def inter_irecv(self, tensor: Any, src: int, group: Any) -> Any:
        """Starts receiving rank ``src``'s next message into ``tensor``; returns a handle for
        ``inter_wait``."""
        raise self._no_inter("recv")

    def inter_wait(self, handles: Sequence[Any], timeout: float) -> None:
        """Returns once every message of ``handles`` is sent or has arrived; raises once
        ``timeout`` seconds have passed."""
        raise self._no_inter("wait")

    def inter_barrier(self, group: Any) -> None:
        """Returns once every member of ``group`` has called it."""
        raise self._no_inter("barrier")

    def _no_inter(self, what: str) -> Exception:
        from .._symm import Unsupported

        return Unsupported(
            f"the {self.name} platform has no {what} between nodes: groups whose members lie on several hosts "
            f"need it (symm moves data between nodes over the framework's own process groups)"
        )

    # -- the local work of symm.hier (same defaults) -------------------------------------------
    def flat(self, tensor: Any) -> Any:
        """A 1-D view of the contiguous ``tensor`` (no copy)."""
        raise self._no_inter("flat view")

    def narrow(self, flat: Any, start: int, numel: int) -> Any:
        """The view of ``numel`` elements of the 1-D ``flat`` from ``start`` (no copy)."""
        raise self._no_inter("narrow view")

    def scratch(self, like: Any, numel: int) -> Any:
        """A new 1-D tensor of ``numel`` elements of ``like``'s dtype, on its device, zeroed."""
        raise self._no_inter("scratch tensor")

    def int_tensor(self, values: Sequence[int]) -> Any:
        """A new 1-D int64 tensor of ``values`` (on the host)."""
        raise self._no_inter("integer tensor")

    def copy_into(self, dst: Any, src: Any) -> None:
        """Copies ``src`` into ``dst`` (same dtype and element count)."""
        raise self._no_inter("copy")

    def reduce_into(self, out: Any, parts: Sequence[Any], op: str, divisor: int) -> None:
        """``out`` = ``parts[0] (op) parts[1] (op) ...``, folded in this order in the accumulator
        of symm's reductions (f32 for 16-bit and 8-bit floats, the dtype itself otherwise) and
        rounded once into ``out``'s dtype; ``op`` is ``"sum"``, ``"avg"`` (the sum divided by
        ``divisor`` in the accumulator), ``"max"`` or ``"min"`` (NaN wins; for bool: or, or, and).
        ``out`` may be one of ``parts``."""
        raise self._no_inter("local reduction")

    # -- tensors ---------------------------------------------------------------------------
    @abc.abstractmethod
    def describe(self, tensor: Any) -> Optional[Desc]:
        """The descriptor of a framework tensor, or None when ``tensor`` is not one.

        Every field comes from the framework's own tensor, not from methods a subclass may
        override, and the storage field bounds the memory the native side may touch: a tensor
        whose data does not lie within it (no real storage, storage shrunk under a view) is
        refused with InvalidArgument, never read."""

    @abc.abstractmethod
    def dtype_name(self, dtype: Any) -> Optional[str]:
        """The name of a framework dtype (``"bfloat16"``), or None when it is not one."""

    @abc.abstractmethod
    def scalar(self, value: Any) -> Any:
        """``value`` as a Python int when it is a one-element integer tensor, else unchanged
        (offsets, sizes and signal values may be given as tensors)."""

    @abc.abstractmethod
    def wrap(self, block: Any, shape: Sequence[int], dtype: Any) -> Any:
        """A tensor of ``shape`` and ``dtype`` whose storage is ``block`` (a native heap block
        exporting writable bytes), without copying; the tensor keeps ``block`` alive."""

    def itemsize(self, dtype: Any) -> Optional[int]:
        """Bytes per element of the framework dtype ``dtype``, or None when it is not one."""
        return None

    def wrap_peer(self, view: Any, shape: Sequence[int], dtype: Any, storage_offset: int) -> Any:
        """A tensor of ``shape`` and ``dtype`` starting ``storage_offset`` elements into ``view`` (a
        native ``PeerBuffer``: writable bytes of a member's copy of a whole allocation), without
        copying; its storage is all of ``view``, which the tensor keeps alive. The caller checked
        that the elements lie within ``view``."""
        raise NotImplementedError(f"the {self.name} platform cannot wrap peer memory")

    @abc.abstractmethod
    def detach_storage(self, tensor: Any) -> None:
        """Points ``tensor`` at empty storage and marks it freed, so that a freed symmetric
        tensor fails loudly when used again (other views of the same memory are not affected)."""

    def is_freed(self, tensor: Any) -> bool:
        """Whether ``tensor`` was released by ``symm.free`` (marked by ``detach_storage``)."""
        return False

    # -- devices ---------------------------------------------------------------------------
    def device_type(self, tensor: Any) -> str:
        """The device type of ``tensor`` (``"cpu"`` for anything that is not a tensor: the call
        then refuses it by name). Asked by every call whose runtime its tensors choose; the
        default describes the tensor."""
        d = None if tensor is None else self.describe(tensor)
        return "cpu" if d is None else d[4]

    def device_support(self, device: str) -> Optional[str]:
        """What is missing for tensors of device type ``device`` (``"npu"``), or None when the
        framework serves them. The default: no device but the CPU."""
        return f"the {self.name} platform serves CPU tensors only"

    def current_device(self, device: str) -> int:
        """The index of the caller's current device of type ``device``."""
        raise NotImplementedError(f"the {self.name} platform has no {device} devices")

    def current_stream(self, device: str) -> int:
        """The caller's current stream of device type ``device``, as an address (the device
        runtime's handle), read right before each call that runs on it."""
        raise NotImplementedError(f"the {self.name} platform has no {device} streams")

    def record_event(self, device: str) -> Any:
        """A new event of the framework recorded on the caller's current stream of ``device``
        (``symm.stream_event``)."""
        raise NotImplementedError(f"the {self.name} platform has no {device} streams")

    def wrap_device(self, block: Any, shape: Sequence[int], dtype: Any) -> Any:
        """A tensor of ``shape`` and ``dtype`` on ``block``'s device (a native heap block of
        device memory: ``ptr``, ``nbytes``, ``dtype``), without copying. It need not keep
        ``block`` alive: the API holds the block until ``free``."""
        raise NotImplementedError(f"the {self.name} platform has no device tensors")

    def guard_other_library(self, guard: "OtherLibraryGuard") -> bool:
        """Under ``SYMM_VALIDATE=1``: routes the framework's own collective library (PyTorch:
        ``torch.distributed``) through ``guard``, so that a call of either library on memory
        the other's unfinished asynchronous operation still uses fails (``docs/design.md``,
        "Interop"). Returns whether it did; the default does nothing."""
        return False

    def host_work_settler(self) -> Optional[Callable[[], None]]:
        """A function that completes the framework's queued operations on host memory, which
        symm calls before each call (a peer may read, through the heap, what such an operation
        writes: a barrier must not overtake it); None (the default) when the framework's CPU
        operations have finished when they return."""
        return None

    def fast_path(self) -> Optional[FastPath]:
        """What the native fast path needs to read this platform's tensors itself, or None
        (the default: every call takes the full path through ``describe``). Asked once, by
        ``symm.init``."""
        return None

    def future(self) -> Any:
        """A new, incomplete future of the framework (``symm.Work.get_future``): an object with
        ``set_result(value)`` and ``set_exception(exc)``."""
        raise NotImplementedError(f"the {self.name} platform has no futures")

    # -- profiling -------------------------------------------------------------------------
    def profiling(self) -> bool:
        """Whether the framework's profiler is recording now (checked on every call: cheap)."""
        return False

    def record_function(self, name: str) -> ContextManager[Any]:
        """A context manager that shows ``name`` as a range in the framework's profiler."""
        return contextlib.nullcontext()
