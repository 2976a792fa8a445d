"""The public API: the RFC's names and argument order over the native communicator.

Everything that needs the framework goes through the platform (``symm.platform``); everything
that needs validation with the group, the heap or the peers happens in the native module, which
raises the ``symm.SymmError`` family with messages naming the argument, its value and the rank.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import os
import threading
from collections import deque
from typing import Any, Callable, Dict, Hashable, List, Optional, Sequence, TypeVar, cast

from . import _diag, _symm
from .platform import get_platform
from .platform.base import OtherLibraryGuard, Platform


class _State:
    """The runtime of this process: one communicator over the ranks ``init`` was called for (the
    CPU backend's), and one more per device type whose tensors were used (``devices``)."""

    def __init__(
        self,
        platform: Platform,
        comm: _symm.Communicator,
        ranks: List[int],
        init_key: Hashable,
        store: Any = None,
        secret: Optional[bytes] = None,
    ) -> None:
        self.platform = platform
        self.comm = comm
        #: The device type of the tensors it moves (``"cpu"``, ``"npu"``), read once.
        self.device: str = comm.device
        #: The start-up store and secret, for the runtimes of devices started later.
        self.store = store
        self.secret = secret
        #: The runtime of each device type used so far (``"npu"``: the Ascend backend), started
        #: by the first call on its tensors.
        self.devices: Dict[str, "_State"] = {}
        #: A device runtime's heap blocks behind the tensors of ``empty``, by address: the
        #: platform's device tensors cannot hold them, so they live until ``free``.
        self.blocks: Dict[int, Any] = {}
        #: Global (framework) rank of each native rank.
        self.ranks = ranks
        self.native_of: Dict[int, int] = {g: n for n, g in enumerate(ranks)}
        self.world = comm.world
        self.init_key = init_key
        #: Native group per framework group object, built once.
        self.groups: Dict[Hashable, _symm.Group] = {}
        #: How the fast path of ``shmem_allreduce`` reads tensors (``"handle"``, ``"shim"``,
        #: ``"descriptors"``), or None when it is off (``SYMM_FAST_PATH=0``, or a platform
        #: without one).
        self.fast_path: Optional[str] = None
        #: Works whose futures wait for them, in issue order, and the one thread that completes
        #: them (started with the first; see ``_watch``).
        self.watched: "deque[_symm.Work]" = deque()
        self.watching = threading.Condition(threading.Lock())
        self.watcher: Optional[threading.Thread] = None


_lock = threading.RLock()
_state: Optional[_State] = None
#: Start-up attempts of this process: a failed attempt (every rank fails together, e.g. heap
#: sizes that differ) leaves keys in the store, so each attempt uses its own key prefix.
_attempts = 0


def _error(cls: type, rank: Optional[int], text: str) -> Exception:
    """An exception of the symm family raised on the Python side, formatted as the native ones."""
    exc = cls(f"rank {rank}: {text}" if rank is not None else text)
    exc.rank = rank
    return exc


def _invalid(rank: Optional[int], arg: str, value: Any, reason: str) -> Exception:
    return _error(_symm.InvalidArgument, rank, f"invalid argument: {arg} = {value}: {reason}")


def _ranks_of(platform: Platform, rank: Optional[int], group: Any, arg: str = "group") -> List[int]:
    """The global ranks of ``group``; GroupError naming ``arg`` when the platform knows no such group."""
    try:
        return list(platform.group_ranks(group))
    except LookupError as e:
        raise _error(_symm.GroupError, rank, f"{arg} = {group!r}: {e}") from None


def _int_list(rank: Optional[int], arg: str, values: Any) -> List[int]:
    try:
        out = [v.__index__() for v in values]
    except (TypeError, AttributeError):
        raise _invalid(rank, arg, repr(values), "expected a sequence of ints") from None
    if len(set(out)) != len(out):
        raise _error(_symm.GroupError, rank, f"{arg} = {out}: a rank appears twice")
    if not out:
        raise _error(_symm.GroupError, rank, f"{arg} = []: a group needs at least one rank")
    return out


# --------------------------------------------------------------------------------------------
# Profiler ranges: every public call shows up in the framework's profiler (torch.profiler) as
# ``symm::<op>(<numel> x <dtype>, group=<ranks>)`` while a profiler records. Without one, the
# cost is one attribute check per call.
# --------------------------------------------------------------------------------------------

F = TypeVar("F", bound=Callable[..., Any])


def _size(st: _State, tensor: Any) -> str:
    """``<numel> x <dtype>`` of a tensor, or of a list of tensors together."""
    many = isinstance(tensor, (list, tuple))
    ds = [d for d in map(st.platform.describe, tensor if many else [tensor]) if d is not None]
    if not ds:
        return "?"
    return f"{sum(d[1] for d in ds)} x {ds[0][2].rpartition('.')[2]}"


def _count(st: _State, n: Any, like: Any) -> str:
    d = st.platform.describe(like)
    dtype = "?" if d is None else d[2].rpartition(".")[2]
    try:
        numel = int(st.platform.scalar(n))
    except (TypeError, ValueError):
        numel = "?"  # type: ignore[assignment]
    return f"{numel} x {dtype}"


def _group_text(st: _State, group: Any) -> str:
    if group is None:
        return "group=world"
    try:
        return f"group={list(st.platform.group_ranks(group))}"
    except Exception:
        return f"group={group!r}"


def _profiled(op: str, describe: Callable[[_State, Dict[str, Any]], str]) -> Callable[[F], F]:
    """Wraps ``fn`` in ``record_function(f"symm::{op}({describe(...)})")`` while the framework's
    profiler records; ``describe`` gets the call's arguments by name (defaults applied)."""

    def deco(fn: F) -> F:
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            st = _state
            if st is None or not st.platform.profiling():
                return fn(*args, **kwargs)
            try:
                bound = sig.bind(*args, **kwargs)
                bound.apply_defaults()
                what = describe(st, bound.arguments)
            except Exception:
                what = "?"  # bad arguments: the call itself reports them
            with st.platform.record_function(f"symm::{op}({what})"):
                return fn(*args, **kwargs)

        return cast(F, wrapper)

    return deco


def _on(arg: str) -> Callable[[_State, Dict[str, Any]], str]:
    """Describes a call by the tensor argument ``arg`` and the ``group`` argument."""
    return lambda st, a: f"{_size(st, a[arg])}, {_group_text(st, a.get('group'))}"


def _on_count(like: str, size: Optional[str] = None) -> Callable[[_State, Dict[str, Any]], str]:
    """Describes a call by the elements it moves (the argument ``size``, or one when None) of
    the dtype of the tensor argument ``like``, and the ``group`` argument."""
    return lambda st, a: f"{_count(st, 1 if size is None else a[size], a[like])}, {_group_text(st, a['group'])}"


def init(group: Any = None) -> None:
    """Starts symmetric memory on this process. Collective over ``group``.

    Called implicitly by the first symm call when not called before. Rank and world size come
    from the framework (``torch.distributed.init_process_group`` must have run, e.g. under
    ``torchrun``); start-up data goes through the framework's key-value store under the prefix
    ``symm``. The heap size is ``SYMMETRIC_MEMORY_HEAP_SIZE`` (bytes, K/M/G suffixes, default
    1 GiB, the same on every rank); waits are bounded by ``SYMMETRIC_MEMORY_TIMEOUT`` (seconds,
    default 120). The start-up records are authenticated with ``SYMM_JOB_SECRET`` when it is
    set, else with a fresh secret shared over the process group (see "Start-up security" in the
    package's README); a rank whose start-up fails makes its peers fail at once.

    Args:
        group: the ranks that share symmetric memory: ``None`` for the whole job, or a process
            group (for example the ranks of one node, when the job spans nodes). Afterwards
            ``group=None`` in every call means this group, and ``target_rank`` with
            ``group=None`` is a rank of it.

    Raises:
        BootstrapError: the framework is not initialised, or the exchange failed.
        GroupError: this rank is not a member of ``group``.
        InvalidArgument: symm was already started for another group.
    """
    global _state, _attempts
    with _lock:
        _diag.install_logging()
        platform = get_platform()
        if not platform.is_initialized():
            raise _error(
                _symm.BootstrapError,
                None,
                f"bootstrap failed: the {platform.name} distributed runtime is not initialised "
                "(call torch.distributed.init_process_group first, or run under torchrun)",
            )
        me = platform.rank()
        key = None if group is None else platform.group_key(group)
        if _state is not None:
            if _state.init_key == key:
                return
            raise _invalid(
                me, "group", repr(group), "symm is already initialised for another group (one runtime per process)"
            )
        ranks = list(range(platform.world_size())) if group is None else _ranks_of(platform, me, group)
        if me not in ranks:
            raise _error(_symm.GroupError, me, f"this rank is not a member of the group with global ranks {ranks}")
        # Distinct groups initialising on one store (one per node) never share keys.
        digest = hashlib.sha1(",".join(map(str, ranks)).encode()).hexdigest()[:16]
        store = platform.store(f"symm/{len(ranks)}-{digest}/")
        _attempts += 1
        # Every rank takes part (also one with SYMM_JOB_SECRET set, which then wins in the native
        # init), so ranks that differ in that variable do not wait for each other here.
        try:
            secret = platform.share_secret(group, ranks)
        except Exception as e:  # noqa: BLE001 - the exchange still runs, unauthenticated
            secret = None
            logging.getLogger("symm").warning(
                "rank %d: no secret could be shared over the process group (%r): the start-up records "
                "are not authenticated (set SYMM_JOB_SECRET on every rank)",
                me,
                e,
            )
        comm = _symm.init(ranks.index(me), len(ranks), store, prefix=f"boot{_attempts}", secret=secret)
        state = _State(platform, comm, ranks, key, store, secret)
        # _symm.init refused any SYMM_FAST_PATH but an on/off value (symm_core::config).
        if os.environ.get("SYMM_FAST_PATH", "").strip().lower() not in ("0", "false", "no", "off"):
            try:
                fast = platform.fast_path()
                if fast is not None:
                    groups = state.groups if fast.groups_by_identity else None
                    state.fast_path = comm.enable_fast_path(
                        fast.tensor_types, fast.dtypes, fast.profiler, groups, fast.shim, list(fast.probes)
                    )
            except Exception as e:  # an optimisation only: without it every call takes the full path
                logging.getLogger("symm").warning("rank %d: the fast path of shmem_allreduce is off: %r", me, e)
        _state = state
        if comm.validates:
            guard = OtherLibraryGuard(clash=_in_flight_clash, started=_symm.foreign_started, refuse=_refuse_other(me))
            platform.guard_other_library(guard)


def _in_flight_clash(ptr: int, nbytes: int) -> Optional[str]:
    """How symm's asynchronous operation in flight on ``nbytes`` bytes at ``ptr`` is shown, in any
    runtime of this process, or None (the interop guard's check)."""
    st = _state
    if st is None:
        return None
    for runtime in [st, *st.devices.values()]:
        clash = runtime.comm.in_flight_clash(ptr, nbytes)
        if clash is not None:
            return clash
    return None


def _refuse_other(rank: int) -> Callable[[str, str, str], Exception]:
    return lambda arg, shown, reason: _invalid(rank, arg, shown, reason)


def is_initialized() -> bool:
    """Whether ``init`` has run in this process."""
    return _state is not None


def _current() -> _State:
    state = _state
    if state is None:
        init()
        state = _state
        assert state is not None
    return state


def _current_for(value: Any) -> _State:
    """The runtime of the device ``value`` (a tensor, or a list whose first entry is one) is on,
    started by this call when it is the first on that device (collectively: every member's first
    call on a device is the same call); the CPU's for anything else, which the call then refuses
    by name."""
    st = _current()
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    return _on_device(st, st.platform.device_type(value))


def _located(tensor: Any, arg: str) -> "tuple[_State, Any]":
    """The runtime of the device ``tensor`` is on (as ``_current_for``) and its description."""
    st = _current()
    d = _desc(st, tensor, arg)
    if d[4] != "cpu":
        st = _on_device(st, d[4])
    return st, d


def _on_device(st: _State, device: str) -> _State:
    """The runtime of ``device`` (``st`` itself for the CPU), started when it is not yet."""
    if device == "cpu":
        return st
    dev = st.devices.get(device)
    return dev if dev is not None else _start_device(st, device)


#: The backend of each device type the platform's tensors can be on.
_DEVICE_BACKENDS = {"npu": "ascend"}


def _start_device(st: _State, device: str) -> _State:
    """Starts the runtime of ``device`` over the ranks of ``st``, through the same store."""
    global _attempts
    with _lock:
        dev = st.devices.get(device)
        if dev is not None:
            return dev
        me = st.comm.rank
        backend = _DEVICE_BACKENDS.get(device)
        if backend is None:
            # The CPU runtime refuses the tensor, naming its device (the native check).
            return st
        missing = st.platform.device_support(device)
        if missing is not None:
            raise _error(_symm.DeviceError, me, f"{device} tensors: {missing}")
        if backend not in _symm.BACKENDS:
            raise _error(
                _symm.DeviceError,
                me,
                f"{device} tensors need symm's {backend} backend, which this build does not have (built with: "
                f"{', '.join(_symm.BACKENDS) or 'none'}): rebuild it with the cargo feature, "
                f"MATURIN_PEP517_ARGS='--features {backend}' pip install ./symm-python (docs/ascend.md)",
            )
        _attempts += 1
        comm = _symm.init(
            me,
            st.comm.world_size,
            st.store,
            prefix=f"{device}{_attempts}",
            secret=st.secret,
            backend=backend,
            device=st.platform.current_device(device),
        )
        dev = _State(st.platform, comm, st.ranks, st.init_key, st.store, st.secret)
        st.devices[device] = dev
        return dev


def _device_stream(st: _State) -> int:
    """The caller's current stream of ``st``'s device, as an address (read right before each
    call: torch_npu submits its queued work to the stream when asked for it)."""
    return st.platform.current_stream(st.device)


def _stream(st: _State) -> Optional[int]:
    """The stream argument of a native call: the caller's stream on a device, None on the CPU."""
    return None if st.device == "cpu" else _device_stream(st)


def _native_group(st: _State, group: Any) -> _symm.Group:
    if group is None:
        return st.world
    key = st.platform.group_key(group)
    g = st.groups.get(key)
    if g is not None:
        return g
    rank = st.comm.rank
    ranks = _ranks_of(st.platform, rank, group)
    outside = [r for r in ranks if r not in st.native_of]
    if outside:
        raise _error(
            _symm.GroupError,
            rank,
            f"group with global ranks {list(ranks)}: ranks {outside} are outside the ranks symm was "
            f"initialised for ({st.ranks})",
        )
    g = st.comm.group([st.native_of[r] for r in ranks])
    st.groups[key] = g
    return g


def _freed(st: _State, arg: str, entry: Optional[int] = None) -> Exception:
    at = "" if entry is None else f"entry {entry}: "
    return _invalid(
        st.comm.rank,
        arg,
        f"{at}<tensor released by symm.free()>",
        "was released by symm.free(); its memory belongs to the symmetric heap again (allocate a new "
        "tensor with symm.empty())",
    )


def _desc(st: _State, tensor: Any, arg: str) -> Any:
    if st.platform.is_freed(tensor):
        raise _freed(st, arg)
    d = st.platform.describe(tensor)
    if d is None:
        raise _invalid(st.comm.rank, arg, f"<{type(tensor).__name__}>", f"expected a {st.platform.name} tensor")
    return d


def _transfer(st: _State, target: Any, target_offset: Any, src: Any, src_offset: Any, size: Any) -> List[Any]:
    """The arguments of a put or get that follow the group, as the native side takes them
    (``target`` described already, by ``_located``)."""
    scalar = st.platform.scalar
    return [target, scalar(target_offset), _desc(st, src, "src"), scalar(src_offset), scalar(size)]


def _signal(st: _State, signal: Any, offset: Any, value: Any) -> List[Any]:
    """The signal word (described already) and its operand (``signal_value`` or
    ``compare_value``), as the native side takes them."""
    return [signal, st.platform.scalar(offset), st.platform.scalar(value)]


@_profiled("alloc", lambda st, a: f"{a['shape']} x {a['dtype']}, {_group_text(st, a['group'])}")
def empty(shape: Any, dtype: Any, group: Any = None, device: Any = None) -> Any:
    """A tensor in symmetric memory: the same heap offset on every member of ``group``.

    Collective over ``group``: every member calls it, in the same order, with the same size.
    The tensor is an ordinary CPU tensor (any torch op may read or write it) whose storage is
    this rank's copy of the allocation, without any copy. Its contents are uninitialised.
    A zero-element request still takes part in the size agreement but reserves nothing: it
    returns an ordinary empty tensor, which is not symmetric.

    Memory is released by ``symm.free(tensor)`` (collective), or when the tensor is
    garbage-collected on every member: a tensor garbage-collected without ``free`` is dropped
    on this rank at once (no communication), and its range comes back at the group's next
    ``empty`` (or ``free``), which every member calls anyway, once every member has dropped it.
    ``symm.memory_stats()`` shows the heap's use.

    Args:
        shape: an int or a sequence of ints.
        dtype: a ``torch.dtype`` (float32/64, float16, bfloat16, float8_e4m3fn, float8_e5m2,
            int8/16/32/64, uint8, bool).
        group: the members (``None``: every rank).
        device: ``None`` or ``"cpu"``: the CPU backend's heap; ``"npu"`` (or ``"npu:N"``,
            ``torch.device("npu")``): the Ascend backend's heap on the caller's current NPU
            (needs torch_npu, CANN and a build with the ``ascend`` feature: docs/ascend.md),
            started by the first call on npu tensors (collective, like this one).

    Returns:
        torch.Tensor: this rank's copy (on ``device``). An npu tensor's memory stays reserved
        until ``symm.free`` (the framework's device tensors cannot hold the allocation).

    Raises:
        InvalidArgument: a bad shape, dtype or device. HeapError: sizes differ between members.
        HeapExhausted: no common free range. GroupError: not a member, or the group spans hosts.
        DeviceError: ``device="npu"`` where torch_npu, CANN or the backend is missing.
    """
    st = _current()
    st = _on_device(st, _check_device(st.comm.rank, device))
    g = _native_group(st, group)
    name = st.platform.dtype_name(dtype)
    if name is None:
        raise _invalid(st.comm.rank, "dtype", repr(dtype), f"expected a {st.platform.name} dtype")
    block = st.comm.alloc(g, shape, name)
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if st.device == "cpu":
        return st.platform.wrap(block, dims, dtype)
    tensor = st.platform.wrap_device(block, dims, dtype)
    if block.nbytes:
        st.blocks[block.ptr] = block
    return tensor


def _check_device(rank: int, device: Any) -> str:
    """The device type ``device`` names (``"cpu"`` for None): ``cpu`` or ``npu``, others refused
    by name."""
    if device is None:
        return "cpu"
    kind = str(getattr(device, "type", device)).split(":")[0]
    if kind not in ("cpu", "npu"):
        raise _invalid(rank, "device", repr(device), "expected cpu or npu")
    return kind


@_profiled("free", lambda st, a: _size(st, a["tensor"]))
def free(tensor: Any) -> None:
    """Releases the symmetric allocation ``tensor`` lies in. Collective over the group that
    allocated it: every member frees the same allocation, in the same order (members that name
    different allocations all get ``HeapError``, and nothing is freed).

    The memory must not be used afterwards. ``tensor`` itself becomes a ``FreedTensor``: every
    torch operation on it raises ``RuntimeError``, and passing it to any symm call (``free``
    included) raises ``InvalidArgument`` naming the argument. Other views of the allocation
    (slices, ``view``) still alias the released range, which a later ``empty`` may reuse: do not
    keep any.
    """
    st = _current_for(tensor)
    d = _desc(st, tensor, "tensor")
    if d[1] == 0:
        return  # a zero-element allocation reserves nothing (and is not heap memory)
    st.comm.free(d)
    for ptr, block in list(st.blocks.items()):
        if ptr <= d[0] < ptr + block.nbytes:
            del st.blocks[ptr]
    st.platform.detach_storage(tensor)


def memory_stats(device: Any = None) -> Dict[str, Any]:
    """This rank's use of its symmetric heap, in bytes (allocations take whole 4 KiB pages).
    Local: no communication. ``device``: ``None`` or ``"cpu"`` for the CPU backend's heap,
    ``"npu"`` for the Ascend backend's (once npu tensors were used; InvalidArgument before).

    Returns:
        dict: ``heap_size``; ``reserved`` (held by allocations, = ``in_use`` + ``dropped``);
        ``in_use`` (held by tensors alive on this rank); ``dropped`` (tensors garbage-collected
        on this rank without ``free`` whose group's other members still hold theirs: they come
        back at the group's next ``empty`` once every member has dropped them); ``free``;
        ``largest_free`` (the longest free range here; an allocation also needs the same range
        free on the other members); ``allocations`` (live ones, dropped included); ``groups``:
        ``{global ranks (tuple): {"reserved", "in_use", "dropped", "allocations"}}`` for every
        group holding memory (the collective workspace of a group that ran collectives
        included).
    """
    st = _current()
    kind = _check_device(st.comm.rank, device)
    if kind != "cpu":
        if kind not in st.devices:
            raise _invalid(st.comm.rank, "device", repr(device), f"no {kind} tensors were used yet: it has no heap")
        st = st.devices[kind]
    raw = st.comm.memory_stats()
    out: Dict[str, Any] = {k: v for k, v in raw.items() if k != "groups"}
    out["groups"] = {tuple(st.ranks[n] for n in ranks): figures for ranks, figures in raw["groups"]}
    return out


def stream_event(device: Any = "npu") -> Any:
    """An event of the framework recorded now on the caller's current stream of ``device``.

    symm's operations on ``npu`` tensors run on the caller's current NPU stream, in the order
    issued, so this event follows every one this thread has issued on that stream, blocking or
    ``async_op=True``. A consumer on another stream (compute on a side stream, or a library
    that does not order itself against the current stream) waits for it without the host
    waiting: ``other_stream.wait_event(symm.stream_event())``. Not needed for torch_npu's HCCL
    process group, which orders its own streams after the current one (``docs/design.md``,
    "Interop"). Local: no communication.

    Raises:
        Unsupported: ``device`` is ``cpu``: symm's CPU operations complete on the host (a
            blocking call when it returns, an asynchronous one at ``wait()``).
        DeviceError: what ``device``'s tensors need is missing (as for any first call on them).
    """
    st = _current()
    kind = _check_device(st.comm.rank, device)
    if kind == "cpu":
        raise _error(
            _symm.Unsupported,
            st.comm.rank,
            "stream_event(device='cpu'): symm's CPU operations run on no stream of the caller; they complete on "
            "the host (a blocking call when it returns, an asynchronous one at wait())",
        )
    _on_device(st, kind)
    return st.platform.record_event(kind)


def is_symmetric(tensor: Any) -> bool:
    """Whether ``tensor``'s memory lies in a live symmetric allocation of this rank."""
    st = _current()
    d = st.platform.describe(tensor)
    if d is None:
        return False
    # A local question: a device whose runtime has not started has no symmetric memory yet.
    dev = st if d[4] == "cpu" else st.devices.get(d[4])
    return dev is not None and dev.device == d[4] and dev.comm.is_symmetric(d[0])


@_profiled("barrier", lambda st, a: _group_text(st, a["group"]))
def barrier(group: Any = None) -> None:
    """Blocks until every member of ``group`` has called it; everything any member issued
    before is then complete and visible to every member. Bounded by
    ``SYMMETRIC_MEMORY_TIMEOUT`` (Timeout, naming the ranks that did not arrive). Where npu
    tensors were used, also a barrier of the npu runtime, after the caller's work on its current
    stream."""
    st = _current()
    st.comm.barrier(_native_group(st, group))
    for dev in st.devices.values():
        dev.comm.barrier(_native_group(dev, group), _device_stream(dev))


@_profiled("put", _on_count("src", "size"))
def shmem_put(
    target: Any,
    target_offset: Any,
    src: Any,
    src_offset: Any,
    size: Any,
    target_rank: Any,
    group: Any = None,
    async_op: bool = False,
) -> Optional[_symm.Work]:
    """Copies ``size`` elements of ``src`` (from ``src_offset``) into ``target_rank``'s copy of
    the symmetric tensor ``target`` at ``target_offset``.

    Offsets and ``size`` count elements of the tensors' dtype (which must agree); tensors are
    used flattened. ``src`` is any contiguous CPU tensor. ``target_rank`` is a rank of ``group``
    (a global rank when ``group`` is None). Returns once the data is in the peer's memory.

    With ``async_op=True`` it checks its arguments, enqueues the copy on the communicator's
    stream and returns a ``symm.Work`` at once (its future's value: ``[src]``); ``src`` belongs
    to the copy until the work has completed (do not write it before ``wait()``).
    """
    st, d = _located(target, "target")
    g = _native_group(st, group)
    args = _transfer(st, d, target_offset, src, src_offset, size)
    hold = [src, target] if async_op else None
    return st.comm.put(g, *args, st.platform.scalar(target_rank), hold, _stream(st))


@_profiled("get", _on_count("src", "size"))
def shmem_get(
    target: Any,
    target_offset: Any,
    src: Any,
    src_offset: Any,
    size: Any,
    target_rank: Any,
    group: Any = None,
    async_op: bool = False,
) -> Optional[_symm.Work]:
    """Reads ``size`` elements of ``target_rank``'s copy of the symmetric tensor ``target``
    (from ``target_offset``) into the local tensor ``src`` at ``src_offset``.

    As HyperParallel's ``shmem_get``: ``target`` names the remote side, ``src`` the local
    destination (any contiguous CPU tensor). Units and ranks as in ``shmem_put``. With
    ``async_op=True``: a ``symm.Work`` at once, as ``shmem_put`` (``src`` is written until it
    has completed; its future's value: ``[src]``).
    """
    st, d = _located(target, "target")
    g = _native_group(st, group)
    args = _transfer(st, d, target_offset, src, src_offset, size)
    hold = [src, target] if async_op else None
    return st.comm.get(g, *args, st.platform.scalar(target_rank), hold, _stream(st))


@_profiled("signal_op", _on_count("signal"))
def shmem_signal_op(
    signal: Any, signal_offset: Any, signal_value: Any, signal_op: Any = 0, target_rank: Any = 0, group: Any = None
) -> None:
    """Atomically updates ``target_rank``'s signal word ``signal[signal_offset]``.

    Args:
        signal: an int32 or int64 symmetric tensor.
        signal_offset: element index of the word.
        signal_value: the operand (must fit the signal's dtype).
        signal_op: ``0``/``"set"`` (the word becomes the value) or ``1``/``"add"``.
        target_rank: a rank of ``group`` (global when ``group`` is None).
        group: the group ``target_rank`` is counted in.
    """
    st, d = _located(signal, "signal")
    g = _native_group(st, group)
    args = _signal(st, d, signal_offset, signal_value)
    st.comm.signal_op(g, *args, signal_op, st.platform.scalar(target_rank), _stream(st))


@_profiled("put_with_signal", _on_count("src", "size"))
def shmem_put_with_signal(
    target: Any,
    target_offset: Any,
    src: Any,
    src_offset: Any,
    size: Any,
    signal: Any,
    signal_offset: Any,
    signal_value: Any,
    signal_op: Any = 0,
    target_rank: Any = 0,
    group: Any = None,
    async_op: bool = False,
) -> Optional[_symm.Work]:
    """``shmem_put``, then ``shmem_signal_op`` on the same ``target_rank``: a peer that sees the
    signal also sees the data. With ``async_op=True``: a ``symm.Work`` at once, as
    ``shmem_put``."""
    st, d = _located(target, "target")
    return st.comm.put_with_signal(
        _native_group(st, group),
        *_transfer(st, d, target_offset, src, src_offset, size),
        *_signal(st, _desc(st, signal, "signal"), signal_offset, signal_value),
        signal_op,
        st.platform.scalar(target_rank),
        [src, target, signal] if async_op else None,
        _stream(st),
    )


@_profiled("wait_for_signal", _on_count("signal"))
def shmem_wait_for_signal(
    depend_tensor: Any,
    signal: Any,
    signal_offset: Any,
    compare_value: Any,
    compare_op: Any = 0,
    group: Any = None,
    timeout: Any = None,
) -> int:
    """Blocks until this rank's ``signal[signal_offset] <compare_op> compare_value`` holds.

    The signal is not reset or consumed. On CPU every earlier call has completed, so
    ``depend_tensor`` (a tensor the wait is ordered after, or None) needs no action.

    Args:
        compare_op: HyperParallel's codes ``0``/``"eq"`` (``==``), ``1``/``"gt"`` (``>``),
            ``2``/``"lt"`` (``<``), then ``3``/``"ne"``, ``4``/``"ge"``, ``5``/``"le"``; names
            in any case. A backend whose library numbers comparisons differently (Ascend SHMEM:
            1 = ne, 2 = gt) translates inside the backend.
        timeout: seconds or a ``datetime.timedelta``; None: ``SYMMETRIC_MEMORY_TIMEOUT``.

    Returns:
        int: the value that satisfied the condition.

    Raises:
        Timeout: the condition did not hold in time (the message shows the last value seen).
        PeerLost: a member of the signal's group ended while this rank waited.
    """
    st, d = _located(signal, "signal")
    p = st.platform
    if depend_tensor is not None and p.is_freed(depend_tensor):
        raise _freed(st, "depend_tensor")
    if depend_tensor is not None and p.describe(depend_tensor) is None:
        raise _invalid(
            st.comm.rank, "depend_tensor", f"<{type(depend_tensor).__name__}>", f"expected a {p.name} tensor or None"
        )
    g = _native_group(st, group)
    args = _signal(st, d, signal_offset, compare_value)
    return st.comm.wait_for_signal(g, *args, compare_op, timeout, _stream(st))


# --------------------------------------------------------------------------------------------
# Collectives and point-to-point messages
#
# Any contiguous CPU tensor is accepted; symmetric tensors (``symm.empty``) are read by peers in
# place, others are staged through the group's workspace. Every call is blocking unless given
# ``async_op=True`` (then it returns a ``symm.Work`` at once, see src/work.rs): it returns when
# this rank's part is complete and its tensors may be reused, releases the GIL while it waits,
# and is bounded by SYMMETRIC_MEMORY_TIMEOUT. Every member of ``group`` calls the same
# collectives in the same order. A rank whose arguments are rejected still joins the call's
# round to reject it, so its peers fail at once with PeerRejected and the group stays usable.
# --------------------------------------------------------------------------------------------


def _low_precision(st: _State, value: Any, arg: str) -> Optional[str]:
    if value is None:
        return None
    name = st.platform.dtype_name(value)
    if name is None:
        raise _invalid(
            st.comm.rank,
            arg,
            repr(value),
            "expected a dtype or its name: float16, bfloat16, float8_e4m3fn, float8_e5m2, "
            "'none' (full precision), or None",
        )
    return name


def _counts(st: _State, value: Any, arg: str) -> List[Any]:
    """A list of counts given as a sequence of ints or a 1-D integer tensor."""
    try:
        items = list(value)
    except (TypeError, RuntimeError, NotImplementedError):
        # Not a sequence, or a tensor whose elements cannot be read (no real storage).
        try:
            shown = repr(value)
        except Exception:  # a tensor without data may fail to print as well
            shown = f"<{type(value).__name__}>"
        raise _invalid(st.comm.rank, arg, shown, "expected a sequence of ints or a 1-D integer tensor") from None
    return [st.platform.scalar(v) for v in items]


def _descs(st: _State, tensors: Any, arg: str) -> List[Any]:
    if st.platform.describe(tensors) is not None or not isinstance(tensors, (list, tuple)):
        raise _invalid(st.comm.rank, arg, f"<{type(tensors).__name__}>", "expected a list of tensors")
    out = []
    for i, t in enumerate(tensors):
        if st.platform.is_freed(t):
            raise _freed(st, arg, i)
        d = st.platform.describe(t)
        if d is None:
            raise _invalid(
                st.comm.rank, arg, f"entry {i}: <{type(t).__name__}>", f"expected a {st.platform.name} tensor"
            )
        out.append(d)
    return out


# The public collectives (``shmem_allreduce`` ... ``shmem_sendrecv``, one per row of the table in
# src/ops.rs) are the native functions: the common case (a plain contiguous CPU tensor, group
# None or one already used, no profiler recording, no low-precision format) in one call, every
# other call through the native full arm, which uses the helpers above for what needs the
# platform, and ``_profile_range``.
globals().update({name: getattr(_symm, name) for name, *_ in _symm.COLLECTIVES})


def _new_future() -> Any:
    """A new future of the platform, for ``symm.Work.get_future``."""
    return _current().platform.future()


def _watch(work: _symm.Work) -> None:
    """Completes ``work``'s future when it completes: hands it to this process's one future
    thread (started with the first), which waits for the watched works in order, the GIL
    released, as the stream completes them in order."""
    st = _current()
    with st.watching:
        st.watched.append(work)
        if st.watcher is None:
            st.watcher = threading.Thread(target=_complete_futures, args=(st,), name="symm-futures", daemon=True)
            st.watcher.start()
        st.watching.notify()


def _complete_futures(st: _State) -> None:
    while True:
        with st.watching:
            while not st.watched:
                st.watching.wait()
            work = st.watched.popleft()
        try:
            work._settle()
        except Exception:  # a future's callback that raised: the future thread goes on
            logging.getLogger("symm").exception("rank %d: completing the future of %r", st.comm.rank, work)


def _profile_range(st: _State, op: str, tensors: Any, group: Any) -> Any:
    """The profiler range of a collective's native full path, ``symm::<op>(<numel> x <dtype>,
    group=<ranks>)``, or None while the framework's profiler does not record."""
    if not st.platform.profiling():
        return None
    try:
        what = f"{_size(st, tensors)}, {_group_text(st, group)}"
    except Exception:
        what = "?"  # bad arguments: the call itself reports them
    return st.platform.record_function(f"symm::{op}({what})")


def create_group(ranks: Sequence[int]) -> Any:
    """A new framework group of these global ranks, in this order (group rank i is
    ``ranks[i]``), through the platform (``torch.distributed.new_group``: every rank of the job
    calls it). Pass it as ``group=`` to any call; its native group is built on first use."""
    platform = get_platform()
    rank = platform.rank() if platform.is_initialized() else None
    ranks = _int_list(rank, "ranks", ranks)
    if platform.is_initialized():
        n = platform.world_size()
        outside = [r for r in ranks if not 0 <= r < n]
        if outside:
            raise _error(_symm.GroupError, rank, f"ranks = {ranks}: ranks {outside} are outside the world of {n}")
    return platform.create_group(ranks)


def split_group(parent: Any, ranks: Sequence[int]) -> Any:
    """A new group of the members ``ranks`` of ``parent`` (ranks of ``parent``, in the new
    group's order). Every member of ``parent`` calls it with the same ``ranks``; members not in
    ``ranks`` get the framework's non-member value (unusable as a group)."""
    platform = get_platform()
    rank = platform.rank() if platform.is_initialized() else None
    ranks = _int_list(rank, "ranks", ranks)
    if parent is None:
        size = platform.world_size()
    else:
        size = len(_ranks_of(platform, rank, parent, "parent"))
    outside = [r for r in ranks if not 0 <= r < size]
    if outside:
        raise _error(
            _symm.GroupError, rank, f"ranks = {ranks}: ranks {outside} are outside the parent group of {size} ranks"
        )
    return platform.split_group(parent, ranks)


# --------------------------------------------------------------------------------------------
# Names HyperParallel's (and torch's symmetric-memory) code calls
# --------------------------------------------------------------------------------------------

#: Bytes of the signal pad ``rendezvous`` attaches to its handle, unless ``set_signal_pad_size``
#: says otherwise: one page of int32 signal words.
DEFAULT_SIGNAL_PAD_SIZE = 4096
_signal_pad_size = DEFAULT_SIGNAL_PAD_SIZE
_MAX_SIGNAL_PAD_SIZE = 1 << 48


def is_shmem_available() -> bool:
    """Whether symm can run in this process: the native module is loaded, the framework adapter
    (``SYMM_PLATFORM``, default torch) is available, and the operating system offers what the
    shared-memory backend needs (anonymous shared memory through ``memfd_create``, on Linux).

    HyperParallel's guard before it uses symmetric memory. Starts nothing and does not need
    ``torch.distributed`` to be initialised yet (``init`` and the first call do)."""
    try:
        get_platform()
    except (_symm.SymmError, ImportError):
        return False
    memfd_create = getattr(os, "memfd_create", None)
    if memfd_create is None:
        return False
    try:
        os.close(memfd_create("symm-probe", getattr(os, "MFD_CLOEXEC", 0)))
    except OSError:
        return False
    return True


def set_signal_pad_size(size: int) -> None:
    """Sets the size in bytes of the signal pad that later ``rendezvous`` calls allocate
    (``DEFAULT_SIGNAL_PAD_SIZE`` = 4096 until then). The pad is int32 signal words, so ``size``
    is a positive multiple of 4. Per process; ranks that rendezvous together must agree
    (``rendezvous`` raises Mismatch on every member otherwise). Signals can also be any
    symmetric int32/int64 tensor of ``symm.empty``.

    Raises:
        InvalidArgument: ``size`` is not a positive multiple of 4 (at most 2**48).
    """
    global _signal_pad_size
    # A one-element tensor is read as every value is (one without readable data is refused).
    size = get_platform().scalar(size)
    if isinstance(size, bool) or not hasattr(size, "__index__"):
        raise _invalid_argument("size", repr(size), "expected an int (bytes, a positive multiple of 4)")
    try:
        n = size.__index__()
    except (TypeError, ValueError, RuntimeError) as e:  # e.g. a one-element float tensor
        raise _invalid_argument("size", repr(size), f"expected an int (bytes, a positive multiple of 4): {e}") from None
    if n <= 0 or n % 4 != 0:
        raise _invalid_argument("size", n, "must be a positive multiple of 4 (the signal pad is int32 words)")
    if n > _MAX_SIGNAL_PAD_SIZE:
        # Larger than any heap; also keeps the size a 64-bit integer for the native check.
        raise _invalid_argument("size", n, f"must be at most {_MAX_SIGNAL_PAD_SIZE} bytes")
    _signal_pad_size = n


def get_signal_pad_size() -> int:
    """The size in bytes of the signal pad ``rendezvous`` allocates: what
    ``set_signal_pad_size`` set, else ``DEFAULT_SIGNAL_PAD_SIZE``."""
    return _signal_pad_size


class SymmetricMemory:
    """What ``rendezvous`` returns: the symmetric tensor among its group, and a signal pad.

    Attributes:
        buffer: the tensor given to ``rendezvous``.
        signal_pad: a zeroed symmetric int32 tensor of ``get_signal_pad_size() // 4`` words in
            the same group, for ``shmem_signal_op``, ``shmem_put_with_signal`` and
            ``shmem_wait_for_signal``; release it with ``symm.free(handle.signal_pad)``.
        group: the group (``None``: every rank symm was initialised for).
        rank: this rank in the group. world_size: the group's size.
    """

    def __init__(self, buffer: Any, signal_pad: Any, group: Any, rank: int, world_size: int) -> None:
        self.buffer = buffer
        self.signal_pad = signal_pad
        self.group = group
        self.rank = rank
        self.world_size = world_size

    def barrier(self) -> None:
        """``symm.barrier`` over the handle's group."""
        barrier(self.group)

    def __repr__(self) -> str:
        words = self.signal_pad.numel()
        return f"SymmetricMemory(rank={self.rank}, world_size={self.world_size}, signal_pad={words} words)"


@_profiled("rendezvous", _on("tensor"))
def rendezvous(tensor: Any, group: Any = None) -> SymmetricMemory:
    """Establishes the symmetric tensor ``tensor`` among ``group``. Collective and blocking:
    every member calls it with its copy of the same tensor (the same view of one ``symm.empty``
    allocation that every member of ``group`` took part in).

    symm needs no exchange of addresses (an allocation lies at the same heap offset on every
    member), so this checks that the members agree, then allocates the handle's signal pad
    (``get_signal_pad_size()`` bytes, zeroed on every member before any member returns).

    Args:
        tensor: a symmetric tensor (``symm.empty``, or a view of one).
        group: a process group, or ``None`` for every rank symm was initialised for.

    Returns:
        SymmetricMemory: ``buffer``, ``signal_pad``, ``rank``, ``world_size``, ``barrier()``.

    Raises:
        InvalidArgument: ``tensor`` is not a symmetric tensor (its peers get PeerRejected).
        GroupError: a member of ``group`` did not take part in the tensor's allocation.
        Mismatch: members passed different tensors or signal pad sizes (on every member).
    """
    st = _current_for(tensor)
    g = _native_group(st, group)
    try:
        d = _desc(st, tensor, "tensor")
    except _symm.InvalidArgument:
        st.comm.reject(g)  # its peers are already waiting in the check
        raise
    pad_bytes = _signal_pad_size
    st.comm.rendezvous(g, d, pad_bytes)
    pad = empty(pad_bytes // 4, "int32", group, device=st.device)
    pad.zero_()
    # No member signals a peer's pad before that peer has zeroed it.
    st.comm.barrier(g, _stream(st))
    rank = g.rank
    assert rank is not None  # a non-member failed in the check
    return SymmetricMemory(tensor, pad, group, rank, g.size)


# --------------------------------------------------------------------------------------------
# Helpers of the framework modules (symm.autograd, symm.perf): not public API.
# --------------------------------------------------------------------------------------------


def _group_size_rank(group: Any = None) -> "tuple[int, int]":
    """``(size, rank in the group)`` of ``group`` (GroupError when this rank is not a member)."""
    st = _current()
    g = _native_group(st, group)
    rank = g.rank
    if rank is None:
        raise _error(_symm.GroupError, st.comm.rank, f"this rank is not a member of the group with ranks {g.ranks}")
    return g.size, rank


def _reject(group: Any = None) -> None:
    """Rejects this rank's part in the next collective of ``group`` (after an argument error
    found in Python), so that the members waiting in it fail with PeerRejected at once."""
    st = _current()
    st.comm.reject(_native_group(st, group))


def _rejected(group: Any, arg: str, value: Any, reason: str) -> Exception:
    """``_reject(group)``, then the InvalidArgument to raise for ``arg``."""
    _reject(group)
    return _invalid_argument(arg, value, reason)


def _invalid_argument(arg: str, value: Any, reason: str) -> Exception:
    """An InvalidArgument of this rank, formatted as the native ones."""
    st = _state
    return _invalid(st.comm.rank if st is not None else None, arg, value, reason)
