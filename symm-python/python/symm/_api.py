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
import time
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
        #: What completes the framework's queued work on host memory before each call (None:
        #: the framework's CPU operations have finished when they return).
        self.settle_host = platform.host_work_settler()
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
        #: The framework group ``init`` was given (None: the whole job): what ``group=None``
        #: means to the platform (``symm.hier`` splits it).
        self.group: Any = None
        #: The topology of each group spanning hosts, by native group id (``symm.hier``).
        self.hier: Dict[int, Any] = {}
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
                f"({platform.how_to_start})",
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
        store = platform.store(f"symm/{len(ranks)}-{digest}/", group)
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
        state.group = group
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
    if state.settle_host is not None:
        state.settle_host()
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
        dev.group = st.group
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
    if isinstance(group, _symm.Group):
        return group  # a native group already (symm.hier's node groups)
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


def _one_sided(st: _State, group: Any, target_rank: Any, what: str) -> _symm.Group:
    """The native group of a one-sided call; GroupError naming both hosts when it spans hosts
    (one-sided calls load and store into the target's memory: one node only)."""
    g = _native_group(st, group)
    if g.spans_hosts:
        raise _hier().refusal(st, g, what, target_rank)
    return g


def _hier() -> Any:
    from . import hier

    return hier


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
    if g.spans_hosts:
        raise _hier().refusal(st, g, "empty")
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
    g = _native_group(st, group)
    if g.spans_hosts:
        return _hier().barrier(st, group)
    st.comm.barrier(g)
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
    g = _one_sided(st, group, target_rank, "shmem_put")
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
    g = _one_sided(st, group, target_rank, "shmem_get")
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
    g = _one_sided(st, group, target_rank, "shmem_signal_op")
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
        _one_sided(st, group, target_rank, "shmem_put_with_signal"),
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
    """What ``rendezvous`` returns: the symmetric tensor among its group, a signal pad, and the
    handle PyTorch's ``torch.distributed._symmetric_memory.rendezvous`` returns (which has no
    CPU backend), over them.

    Attributes:
        buffer: the tensor given to ``rendezvous``.
        signal_pad: a zeroed symmetric int32 tensor of ``get_signal_pad_size() // 4`` words in
            the same group; release it with ``symm.free(handle.signal_pad)``. ``barrier``,
            ``put_signal`` and ``wait_signal`` use its words as said below; the
            others remain free for ``shmem_signal_op``, ``shmem_put_with_signal`` and
            ``shmem_wait_for_signal``.
        group: the group (``None``: every rank symm was initialised for).
        rank: this rank in the group. world_size: the group's size.
        buffer_size: bytes of the allocation ``buffer`` lies in (all of a ``symm.empty``
            tensor); ``get_buffer`` views lie within it. offset: ``buffer``'s byte offset from
            the allocation's start (0 unless ``rendezvous`` was given a view).
        signal_pad_size: bytes of the signal pad.
        buffer_ptrs, signal_pad_ptrs: each member's address of the allocation (of the pad), in
            group order, in this process (a member's copy is mapped here on the CPU backend).

    Signal words (int32, ``W = world_size``, ``C`` channels: ``C = signal_pad_size // (8 *
    W)``): the flag member ``src`` sets in member ``dst``'s pad on channel ``c`` is word ``c *
    W + src`` of ``dst``'s pad, as PyTorch lays them out (1: set, 0: consumed); word
    ``(C + c) * W + dst`` of ``src``'s pad counts the signals ``dst`` consumed from it there
    (what stands in for PyTorch's compare-and-swap: ``put_signal`` waits for it instead of
    spinning on the peer's flag).

    Everything but ``buffer_ptrs``, ``signal_pad_ptrs``, ``get_buffer`` and ``get_signal_pad``
    uses the ``shmem_*`` primitives only, and so works on every backend; those four need a
    backend whose ranks map each other's heaps (the CPU backend) and raise ``Unsupported``,
    naming the backend, on one that does not (Ascend). One thread at a time per handle.
    """

    def __init__(
        self,
        buffer: Any,
        signal_pad: Any,
        group: Any,
        rank: int,
        world_size: int,
        *,
        _runtime: "Optional[tuple[_State, _symm.Group]]" = None,
    ) -> None:
        self.buffer = buffer
        self.signal_pad = signal_pad
        self.group = group
        self.rank = rank
        self.world_size = world_size
        if _runtime is None:
            st = _current_for(buffer)
            _runtime = (st, _native_group(st, group))
        self._st, self._g = _runtime
        #: The native communicator every call goes through.
        self._comm: Any = self._st.comm
        self.offset, self.buffer_size = self._comm.allocation(_desc(self._st, buffer, "buffer"))
        #: The pad's descriptor, read once (its address lies in the heap, mapped for the
        #: communicator's life; a pad released by ``symm.free`` is refused by ``_pad``).
        self._pad_desc = _desc(self._st, signal_pad, "signal_pad")
        self.signal_pad_size: int = self._comm.allocation(self._pad_desc)[1]
        #: Channels of the signal pad: two int32 words per member and channel (flag, count).
        self._channels = self.signal_pad_size // (8 * world_size)
        #: Signals this rank put, per (channel, destination): the count its consumption word
        #: must reach before the next put.
        self._sent: Dict["tuple[int, int]", int] = {}

    # -- peer memory (PyTorch's buffer_ptrs, get_buffer ...) -----------------------------

    @property
    def buffer_ptrs(self) -> List[int]:
        """Each member's copy of the allocation ``buffer`` lies in: its first byte's address in
        this process, in group order. Raises ``Unsupported`` where the backend maps no peer
        heap; ``InvalidArgument`` once the allocation was released (``symm.free``)."""
        return [self._peer(r, self.buffer, "buffer").ptr for r in range(self.world_size)]

    @property
    def signal_pad_ptrs(self) -> List[int]:
        """Each member's signal pad: its address in this process, in group order (as
        ``buffer_ptrs``)."""
        return [self._peer(r, self.signal_pad, "signal_pad").ptr for r in range(self.world_size)]

    def get_buffer(self, rank: Any, sizes: Any, dtype: Any, storage_offset: Any = 0) -> Any:
        """A tensor over member ``rank``'s copy of the allocation, without copying: shape
        ``sizes``, ``dtype``, starting ``storage_offset`` elements (of ``dtype``) from the
        allocation's start (not from ``buffer``'s, when ``rendezvous`` was given a view), as
        PyTorch's. Its storage is the member's whole copy (``storage_offset()`` is
        ``storage_offset``). A write through it is a write into that member's tensor: order it
        with ``barrier``, ``put_signal``/``wait_signal`` or any symm synchronisation. Local.

        The tensor keeps the allocation alive (``buffer`` included) while it lives, also once
        the handle and the original tensor are gone. After ``symm.free`` of the allocation its
        memory belongs to the heap again: like any other view of it, do not use it any more
        (``get_buffer`` itself then raises ``InvalidArgument``).

        Raises:
            GroupError: ``rank`` is not a rank of the group.
            InvalidArgument: ``sizes``, ``dtype`` or ``storage_offset`` is malformed, or the
                elements reach past the allocation (naming the argument and its value).
            Unsupported: the backend does not map its peers' heaps (a device backend).
        """
        return self._view(self.buffer, "buffer", self.buffer_size, rank, sizes, dtype, storage_offset)

    def get_signal_pad(self, rank: Any, sizes: Any = None, dtype: Any = None, storage_offset: Any = 0) -> Any:
        """A tensor over member ``rank``'s signal pad, as ``get_buffer``: ``dtype`` defaults to
        the pad's (int32), ``sizes`` to the rest of the pad from ``storage_offset``."""
        if dtype is None:
            dtype = self.signal_pad.dtype
        if sizes is None:
            itemsize = self._st.platform.itemsize(dtype)
            if itemsize is not None:
                sizes = (max(self.signal_pad_size // itemsize - self._count("storage_offset", storage_offset), 0),)
        return self._view(self.signal_pad, "signal_pad", self.signal_pad_size, rank, sizes, dtype, storage_offset)

    def _peer(self, rank: int, tensor: Any, arg: str) -> Any:
        """Member ``rank``'s copy of ``tensor``'s allocation (a native ``PeerBuffer`` that keeps
        ``tensor``, and so the allocation, alive)."""
        return self._comm.peer_buffer(self._g, rank, _desc(self._st, tensor, arg), tensor)

    def _view(self, tensor: Any, arg: str, nbytes: int, rank: Any, sizes: Any, dtype: Any, storage_offset: Any) -> Any:
        st, me = self._st, self._st.comm.rank
        r = self._member("rank", rank)
        itemsize = st.platform.itemsize(dtype)
        if itemsize is None:
            raise _invalid(me, "dtype", repr(dtype), f"expected a {st.platform.name} dtype")
        try:
            if hasattr(sizes, "__index__"):
                dims = (sizes.__index__(),)
            else:
                dims = tuple(d.__index__() for d in sizes)
        except (TypeError, AttributeError):
            raise _invalid(me, "sizes", repr(sizes), "expected an int or a sequence of ints") from None
        if any(d < 0 for d in dims):
            raise _invalid(me, "sizes", dims, "dimensions must be >= 0")
        offset = self._count("storage_offset", storage_offset)
        numel = 1
        for d in dims:
            numel *= d
        end = (offset + numel) * itemsize
        if end > nbytes:
            arg_, value = ("sizes", dims) if numel * itemsize > nbytes else ("storage_offset", offset)
            raise _invalid(
                me,
                arg_,
                value,
                f"{numel} elements of {dtype} from element {offset} end at byte {end}, past the {nbytes} bytes of "
                f"the {arg}'s allocation (sizes = {dims}, storage_offset = {offset})",
            )
        return st.platform.wrap_peer(self._peer(r, tensor, arg), dims, dtype, offset)

    # -- signals (PyTorch's barrier, put_signal, wait_signal) ----------------------------

    def barrier(self, channel: Any = 0, timeout_ms: Any = None) -> None:
        """Blocks until every member of the group has called ``barrier`` on ``channel``;
        everything a member wrote before it (through ``get_buffer`` views or ``shmem_*``) is
        then visible to every member, as PyTorch's: this rank puts a signal to every peer on
        ``channel``, then waits for (and consumes) every peer's.

        Args:
            channel: a channel of the signal pad, ``0 <= channel < signal_pad_size // (8 *
                world_size)``.
            timeout_ms: the bound in milliseconds; ``None`` or ``0`` (PyTorch's "no
                timeout"): ``SYMMETRIC_MEMORY_TIMEOUT``.

        Raises:
            Timeout: a peer's signal did not come in time, or a peer had not consumed this
                rank's previous one (the message names the peer and the channel).
            InvalidArgument: a bad ``channel`` or ``timeout_ms``.
        """
        ch = self._channel(channel)
        deadline, ms = self._deadline(timeout_ms)
        what = f"barrier(channel={ch})"
        peers = [r for r in range(self.world_size) if r != self.rank]
        for p in peers:
            self._put(p, ch, deadline, ms, what)
        for p in peers:
            self._take(p, ch, deadline, ms, what)

    def put_signal(self, dst_rank: Any, channel: Any = 0, timeout_ms: Any = None) -> None:
        """Sets this rank's flag on ``channel`` in member ``dst_rank``'s signal pad, as
        PyTorch's (a release: what this rank wrote before is visible to ``dst_rank`` once its
        ``wait_signal`` returns). Like PyTorch's compare-and-swap, it first waits until
        ``dst_rank`` has consumed this rank's previous signal on ``channel`` (bounded by
        ``timeout_ms``, as in ``barrier``).

        Raises:
            GroupError: ``dst_rank`` is not a rank of the group.
            Timeout: ``dst_rank`` did not consume the previous signal in time.
            InvalidArgument: a bad ``channel`` or ``timeout_ms``.
        """
        dst = self._member("dst_rank", dst_rank)
        ch = self._channel(channel)
        deadline, ms = self._deadline(timeout_ms)
        self._put(dst, ch, deadline, ms, f"put_signal(dst_rank={dst}, channel={ch})")

    def wait_signal(self, src_rank: Any, channel: Any = 0, timeout_ms: Any = None) -> None:
        """Waits until member ``src_rank`` has set its flag on ``channel`` in this rank's
        signal pad, then consumes it (the flag is 0 again), as PyTorch's (an acquire: what
        ``src_rank`` wrote before its ``put_signal`` is visible here).

        Raises:
            GroupError: ``src_rank`` is not a rank of the group.
            Timeout: no signal came in ``timeout_ms`` (as in ``barrier``).
            InvalidArgument: a bad ``channel`` or ``timeout_ms``.
        """
        src = self._member("src_rank", src_rank)
        ch = self._channel(channel)
        deadline, ms = self._deadline(timeout_ms)
        self._take(src, ch, deadline, ms, f"wait_signal(src_rank={src}, channel={ch})")

    def _put(self, dst: int, ch: int, deadline: float, ms: float, what: str) -> None:
        n = self.world_size
        sent = self._sent.get((ch, dst), 0)
        if sent:
            # The count of this rank's signals dst consumed: int32, wrapping as the word does.
            count = (sent + (1 << 31)) % (1 << 32) - (1 << 31)
            self._wait_word(
                (self._channels + ch) * n + dst,
                count,
                deadline,
                ms,
                f"{what}: group rank {dst} has not consumed (wait_signal) the previous signal of this rank on "
                f"channel {ch}",
            )
        self._signal(ch * n + self.rank, 1, "set", dst)
        self._sent[(ch, dst)] = sent + 1

    def _take(self, src: int, ch: int, deadline: float, ms: float, what: str) -> None:
        n = self.world_size
        flag = ch * n + src
        self._wait_word(flag, 1, deadline, ms, f"{what}: no signal from group rank {src} on channel {ch}")
        self._signal(flag, 0, "set", self.rank)
        self._signal((self._channels + ch) * n + self.rank, 1, "add", src)

    def _pad(self) -> Any:
        """The signal pad's descriptor; InvalidArgument naming ``signal_pad`` once it was
        released by ``symm.free``."""
        if self._st.platform.is_freed(self.signal_pad):
            raise _freed(self._st, "signal_pad")
        return self._pad_desc

    def _signal(self, word: int, value: int, op: str, target: int) -> None:
        self._comm.signal_op(self._g, self._pad(), word, value, op, target, _stream(self._st))

    def _wait_word(self, word: int, value: int, deadline: float, ms: float, what: str) -> None:
        st = self._st
        left = max(deadline - time.monotonic(), 0.0)
        try:
            self._comm.wait_for_signal(self._g, self._pad(), word, value, "eq", left, _stream(st))
        except _symm.Timeout as e:
            me = st.comm.rank
            seen = str(e).removeprefix(f"rank {me}: ")
            raise _error(
                _symm.Timeout, me, f"{what} within {ms:g} ms (word {word} of this rank's signal pad; {seen})"
            ) from None

    # -- arguments ------------------------------------------------------------------------

    def _count(self, arg: str, value: Any) -> int:
        """``value`` as an int >= 0 (one-element integer tensors too); InvalidArgument naming
        ``arg`` otherwise."""
        v = self._st.platform.scalar(value)
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise _invalid(self._st.comm.rank, arg, repr(value), "expected an int >= 0")
        n = v.__index__()
        if n < 0:
            raise _invalid(self._st.comm.rank, arg, n, "must be >= 0")
        return n

    def _member(self, arg: str, value: Any) -> int:
        """``value`` as a rank of the handle's group; GroupError naming ``arg`` otherwise."""
        v = self._st.platform.scalar(value)
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise _invalid(self._st.comm.rank, arg, repr(value), "expected an int (a rank of the handle's group)")
        r = v.__index__()
        if not 0 <= r < self.world_size:
            ranks = [self._st.ranks[n] for n in self._g.ranks]
            raise _error(
                _symm.GroupError,
                self._st.comm.rank,
                f"{arg} = {r} is outside the group of {self.world_size} ranks (global ranks {ranks})",
            )
        return r

    def _channel(self, channel: Any) -> int:
        ch = self._count("channel", channel)
        if ch >= self._channels:
            held = f"channels 0 to {self._channels - 1}" if self._channels else "no channel"
            raise _invalid(
                self._st.comm.rank,
                "channel",
                ch,
                f"the signal pad of {self.signal_pad_size} bytes holds {held} for {self.world_size} ranks (8 bytes "
                "per rank and channel; set_signal_pad_size before rendezvous for more)",
            )
        return ch

    def _deadline(self, timeout_ms: Any) -> "tuple[float, float]":
        """The deadline of a call bounded by ``timeout_ms`` (None or 0: SYMMETRIC_MEMORY_TIMEOUT),
        and the bound in milliseconds."""
        ms = 0 if timeout_ms is None else self._count("timeout_ms", timeout_ms)
        seconds = ms / 1000 if ms else self._st.comm.default_timeout
        return time.monotonic() + seconds, seconds * 1000

    def __repr__(self) -> str:
        words = self.signal_pad_size // 4
        return (
            f"SymmetricMemory(rank={self.rank}, world_size={self.world_size}, buffer_size={self.buffer_size}, "
            f"signal_pad={words} words)"
        )


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
        SymmetricMemory: ``buffer``, ``signal_pad``, ``rank``, ``world_size``, and PyTorch's
        handle: ``buffer_ptrs``, ``signal_pad_ptrs``, ``buffer_size``, ``get_buffer``,
        ``get_signal_pad``, ``barrier``, ``put_signal``, ``wait_signal``.

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
    return SymmetricMemory(tensor, pad, group, rank, g.size, _runtime=(st, g))


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
