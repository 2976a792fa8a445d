"""``torch.distributed``'s backend ``"symm"``: symm's collectives behind a ``ProcessGroup``.

Registered under the name ``"symm"`` for CPU tensors (and ``npu`` ones in a build with the
Ascend backend) when ``import symm`` runs with torch installed, and through the entry point
``torch.distributed.backends`` (``dist.init_process_group("symm")`` finds it without
``import symm``). Two ways to pick it:

- the world: ``dist.init_process_group("symm")`` (or ``"cpu:symm"``). torch builds the default
  group before any ``ProcessGroup`` exists, so symm starts from what the backend factory gets
  (store, rank, size, timeout): ``symm.init()`` runs with a platform that answers from those
  (``_StartPlatform``), the start-up protocol unchanged.
- a group: ``dist.new_group(ranks, backend="symm")`` (or a ``DeviceMesh`` dimension) in a world
  of any backend. The backend serves that group through symm's native group of the same ranks
  in the same order (group rank i is the same member in both). symm's runtime spans the world,
  and its start-up is collective over the world: call ``symm.init()`` on every rank first,
  unless the group is the whole world (then its creation starts symm).

``"cpu:gloo,cpu:symm"`` is refused by torch ("Duplicate device type cpu"): one backend per
device type per group. Mix them with a Gloo world and ``new_group(..., backend="symm")``.

Every operation of ``ProcessGroup`` maps onto symm's native collectives (see the README,
"torch.distributed backend"); reductions SUM, AVG, MAX and MIN are symm's own (group-rank
order, the same bits on every member); PRODUCT, BAND, BOR and BXOR gather every member's data
and reduce it locally in group-rank order; PREMUL_SUM scales locally, then sums.

Groups whose members lie on several hosts run hierarchically (``symm.hier``): symm inside each
node, and between nodes a private Gloo group of the same members that the backend makes when
torch creates the group (the group's own messages would come back into symm). Their collectives
have no asynchronous form: ``async_op=True`` runs them blocking and returns a completed work;
sends and receives stay asynchronous (symm's on the node, Gloo's between hosts).

Timeouts: an operation waits at most the process group's timeout (or the call's own
``timeout`` option). symm's native waits are bounded by ``SYMMETRIC_MEMORY_TIMEOUT``: a call
that may wait longer than that (``async_op=False``) runs as symm's blocking call; a shorter
bound, or ``async_op=True``, runs it on symm's stream and waits for it with that bound.
"""

from __future__ import annotations

import datetime
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend
from torch._C._distributed_c10d import ReduceOp

from . import _api, _symm, hier
from .platform import get_platform, set_platform
from .platform.torch import P2P_TAG, TorchPlatform, drop_transport, set_transport

__all__ = ["NAME", "SymmBackend", "SymmWork", "register"]

#: The name torch knows the backend by.
NAME = "symm"

_RED = ReduceOp.RedOpType
#: Reductions symm runs natively (the names its collectives take).
_NATIVE_OPS = {_RED.SUM: "sum", _RED.AVG: "avg", _RED.MAX: "max", _RED.MIN: "min"}
#: Reductions done here, after gathering every member's data: element-wise, in group-rank order
#: (the same bits on every member). The bitwise ones need integer or bool tensors, as in Gloo.
_LOCAL_OPS: Dict[Any, Callable[..., Any]] = {
    _RED.PRODUCT: torch.mul,
    _RED.BAND: torch.bitwise_and,
    _RED.BOR: torch.bitwise_or,
    _RED.BXOR: torch.bitwise_xor,
}
_BITWISE = (_RED.BAND, _RED.BOR, _RED.BXOR)

#: The base class of a backend written in Python: ``dist.BackendBase`` where torch has it (its
#: documented name since), else torch 2.15's binding of ``c10d::Backend``, whose trampoline calls
#: the Python overrides from C++ (as torch's own ``_nccl4py`` backend uses it).
_BackendBase: Any = getattr(dist, "BackendBase", _C10dBackend)

#: An ``opts.timeout`` that was not set (torch's ``kUnsetTimeout``, -1 ms).
_UNSET = datetime.timedelta(milliseconds=-1)


def _op_name(op: Any) -> str:
    return f"ReduceOp.{getattr(op, 'name', op)}"


def _error(text: str, cause: Optional[BaseException] = None) -> Exception:
    """torch's error for a failed backend call (a ``RuntimeError``, as Gloo raises), symm's
    exception kept as its cause."""
    err = dist.DistBackendError(f"symm backend: {text}")
    err.__cause__ = cause
    return err


def _seconds(timeout: Any) -> Optional[float]:
    """Seconds of a ``timedelta``; None when it is torch's "not set" or "no timeout" (<= 0)."""
    if timeout is None:
        return None
    s = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    return s if s > 0 else None


def _wire(t: torch.Tensor) -> torch.Tensor:
    """``t`` as symm moves it: itself for a dtype symm knows, else its bytes (data-movement
    operations do not care what the bytes mean; e.g. complex, uint16, float8_e4m3fnuz)."""
    if str(t.dtype).rpartition(".")[2] in _symm.DTYPES:
        return t
    return t.reshape(-1).view(torch.uint8)


def _wire_numel(t: torch.Tensor) -> int:
    """How many units of ``_wire(t)`` ``t`` holds (elements, or bytes)."""
    return t.numel() if str(t.dtype).rpartition(".")[2] in _symm.DTYPES else t.numel() * t.element_size()


def _contiguous_out(t: torch.Tensor, finish: List[Callable[[], None]], keep: bool) -> torch.Tensor:
    """A contiguous tensor to receive ``t``'s result: ``t`` itself, or a copy (``keep``: of its
    values, for in-place operations) that ``finish`` writes back (symm reads and writes
    contiguous memory only; Gloo accepts any layout)."""
    if t.is_contiguous():
        return t
    staged = t.contiguous() if keep else torch.empty_like(t, memory_format=torch.contiguous_format)
    finish.append(lambda: t.copy_(staged))
    return staged


class SymmWork(dist.Work):
    """The work of one operation of the backend: symm's asynchronous operations (``symm.Work``)
    plus what runs once they have completed (copies out of staging buffers, local reductions).

    ``wait()``, ``is_completed()``, ``get_future()`` follow ``torch.distributed.Work``; the
    future's value is the list of output tensors, as Gloo's. torch 2.15 hands a Python backend's
    work to its callers wrapped (``PyWorkHolder``), which forwards ``wait`` and ``get_future``
    only: on the object ``dist.all_reduce(..., async_op=True)`` returns, ``is_completed()``
    stays False; ``get_future().done()`` tells (the README, "torch.distributed backend").
    """

    def __init__(
        self,
        where: str,
        op: str,
        outputs: List[torch.Tensor],
        parts: Sequence[Any] = (),
        finish: Sequence[Callable[[], None]] = (),
        timeout: Optional[float] = None,
    ) -> None:
        super().__init__()
        self._where = where
        self._op = op
        self._outputs = outputs
        self._parts = list(parts)
        self._finish = list(finish)
        self._timeout = timeout
        # The follow-up runs once, on whichever thread sees the completion first (the caller's
        # wait(), or symm's future thread through get_future()).
        self._lock = threading.Lock()
        self._settled = False
        self._exc: Optional[BaseException] = None
        self._future: Optional[torch.futures.Future] = None
        #: Set for a send or receive handed out inside a coalescing window: it runs, and
        #: completes, with the window's work.
        self._window: Optional[_Window] = None
        if not self._parts:
            self._settle(None)

    # -- completion ------------------------------------------------------------------------
    def _settle(self, exc: Optional[BaseException]) -> None:
        with self._lock:
            if self._settled:
                return
            if exc is None:
                try:
                    for step in self._finish:
                        step()
                except Exception as e:  # noqa: BLE001 - reported as the operation's error
                    exc = e if isinstance(e, dist.DistBackendError) else self._failed(e)
            self._exc = exc
            self._settled = True

    def _failed(self, e: BaseException, in_flight: bool = False) -> Exception:
        if in_flight:
            return _error(
                f"{self._op} on {self._where}: not completed within {self._timeout} s (the process group's "
                f"timeout, or the call's); it stays in flight on symm's stream: {type(e).__name__}: {e}",
                e,
            )
        return _error(f"{self._op} on {self._where}: {type(e).__name__}: {e}", e)

    def _delegate(self) -> "SymmWork":
        """The work that runs this one: itself, or its coalescing window's once the window ended."""
        if self._window is None:
            return self
        if self._window.work is None:
            raise _error(
                f"{self._op} on {self._where}: waited for inside the coalescing window that issues it "
                "(it runs when the window ends: wait for the window's work)"
            )
        return self._window.work

    def wait(self, timeout: Any = None) -> bool:
        """Blocks until the operation has completed (its outputs are the caller's); at most
        ``timeout`` (a ``timedelta``; none or zero: the process group's timeout)."""
        work = self._delegate()
        if work is not self:
            return work.wait(timeout)
        bound = _seconds(timeout) or self._timeout
        deadline = None if bound is None else time.monotonic() + bound
        for part in self._parts:
            left = None if deadline is None else max(deadline - time.monotonic(), 1e-3)
            try:
                part.wait(left)
            except _symm.SymmError as e:
                # A Timeout of the wait alone leaves the operation in flight (symm's own bound,
                # SYMMETRIC_MEMORY_TIMEOUT, ends it): the work is not failed (yet).
                in_flight = isinstance(e, _symm.Timeout) and not _done(part)
                failed = self._failed(e, in_flight)
                if not in_flight:
                    self._settle(failed)
                raise failed from e
        self._settle(None)
        if self._exc is not None:
            raise self._exc
        return True

    def is_completed(self) -> bool:
        """Whether the operation has completed, successfully or not (does not block)."""
        if self._window is not None:
            return self._window.work is not None and self._window.work.is_completed()
        if not self._settled:
            try:
                if not all(p.is_completed() for p in self._parts):
                    return False
            except _symm.SymmError as e:
                self._settle(self._failed(e))
                return True
            self._settle(None)
        return True

    def is_success(self) -> bool:
        return self.is_completed() and self._delegate()._exc is None

    def exception(self) -> Optional[BaseException]:
        return self._delegate()._exc if self.is_completed() else None

    def result(self) -> List[torch.Tensor]:
        return self._outputs

    def synchronize(self) -> None:
        self.wait()

    def get_future(self) -> torch.futures.Future:
        """A ``torch.futures.Future`` completed with the output tensors (or the error) when the
        operation completes; the same one on every call. DDP's communication hooks chain on it."""
        work = self._delegate()
        if work is not self:
            return work.get_future()
        with self._lock:
            if self._future is not None:
                return self._future
            if self._settled:
                done: torch.futures.Future = torch.futures.Future()
                if self._exc is None:
                    done.set_result(self._outputs)
                else:
                    done.set_exception(self._exc)
                self._future = done
                return done
            futures = [p.get_future() for p in self._parts]
        source = futures[0] if len(futures) == 1 else torch.futures.collect_all(futures)
        # Chained with then(): a Python callback's error becomes the future's own error, which
        # crosses torch's C++ side (the work torch hands out, DDP's reducer) intact, as a
        # RuntimeError naming it ("... DistBackendError: symm backend: ..."). An exception set
        # with set_exception() would reach a waiter there as the future's *value*.
        chained = source.then(lambda _f: self._on_done(futures))
        with self._lock:
            if self._future is None:
                self._future = chained
            return self._future

    def _on_done(self, futures: List[torch.futures.Future]) -> List[torch.Tensor]:
        # Runs on symm's future thread (or on the thread that saw the last part complete). With
        # several parts, collect_all completes at the first failure: the others may still run.
        for f in futures:
            if f.done():
                try:
                    f.value()
                except Exception as e:  # noqa: BLE001 - the operation's error, as torch's
                    self._settle(self._failed(e))
                    break
        self._settle(None)
        if self._exc is not None:
            raise self._exc
        return self._outputs


def _done(part: Any) -> bool:
    """Whether symm's work ``part`` has ended (a failure is an end)."""
    try:
        return bool(part.is_completed())
    except _symm.SymmError:
        return True


class _GlooPart:
    """A message between hosts on a group's private Gloo group, as a part of a ``SymmWork``
    (which waits for its parts as for symm's works: ``wait(seconds)``, ``is_completed()``,
    ``get_future()``)."""

    def __init__(self, work: Any, what: str, rank: int, bound: float) -> None:
        self._work, self._what, self._rank, self._bound = work, what, rank, bound

    def wait(self, timeout: Optional[float] = None) -> bool:
        # Never unbounded: Gloo's wait without a timeout would wait for a peer forever.
        seconds = timeout if timeout is not None else self._bound
        try:
            self._work.wait(datetime.timedelta(seconds=seconds))
        except RuntimeError as e:
            kind = _symm.Timeout if "timed out" in str(e).lower() else _symm.SymmError
            raise _api._error(kind, self._rank, f"{self._what}: {e}") from e
        return True

    def is_completed(self) -> bool:
        # A failed message is completed too: wait() raises its error.
        return bool(self._work.is_completed())

    def get_future(self) -> torch.futures.Future:
        return self._work.get_future()


class _Window:
    """The point-to-point operations of one coalescing window (``batch_isend_irecv``), issued
    together when it ends, and the works of the collectives issued meanwhile."""

    def __init__(self) -> None:
        #: ("send" | "recv", tensor, peer, staging follow-ups, the work handed out)
        self.p2p: List[Tuple[str, torch.Tensor, int, List[Callable[[], None]], SymmWork]] = []
        #: The collectives issued inside the window (they run at once).
        self.works: List[SymmWork] = []
        #: The window's own work, from end_coalescing.
        self.work: Optional[SymmWork] = None


class _StartPlatform(TorchPlatform):
    """symm's torch platform while ``init_process_group("symm")`` builds the default group: no
    group exists yet, so the rank, the world size and the store come from the backend factory.
    Everything else is the torch platform's."""

    def __init__(self, store: Any, rank: int, size: int, timeout: datetime.timedelta) -> None:
        self._store, self._rank, self._size, self._timeout = store, rank, size, timeout

    def is_initialized(self) -> bool:
        return True

    def rank(self) -> int:
        return self._rank

    def world_size(self) -> int:
        return self._size

    def store(self, prefix: str, group: Any = None) -> Any:
        return dist.PrefixStore(prefix, self._store)

    def share_secret(self, group: Any, ranks: Sequence[int]) -> Optional[bytes]:
        # As the torch platform does, over connections the ranks set up through the store
        # before symm starts (a private Gloo group: the group being built is not usable yet),
        # never through the store itself.
        import secrets

        if not dist.is_gloo_available():
            return None
        pg = dist.ProcessGroupGloo(dist.PrefixStore("symm-secret/", self._store), self._rank, self._size, self._timeout)
        if self._rank == 0:
            buf = torch.tensor(list(secrets.token_bytes(32)), dtype=torch.uint8)
        else:
            buf = torch.zeros(32, dtype=torch.uint8)
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        pg.broadcast([buf], opts).wait()
        return bytes(buf.tolist()).hex().encode()


def _start_world(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> None:
    """Starts symm over the world of ``init_process_group("symm")``: ``symm.init()`` itself,
    with the factory's store, rank and size standing in for the default group."""
    previous = get_platform()
    set_platform(_StartPlatform(store, rank, size, timeout))
    try:
        _api.init()
    finally:
        # Later calls of the public API see torch.distributed itself (initialised by then).
        set_platform(previous)
    st = _api._current()
    if st.init_key is not None or st.comm.world_size != size:
        raise _error(
            f"init_process_group: symm already runs on {st.comm.world_size} ranks ({st.ranks}) in this process, "
            f"not on this world of {size}"
        )


def _start_for_group(ranks: List[int]) -> None:
    """Makes sure symm runs before it serves the group of global ``ranks`` in a world of
    another backend."""
    if _api.is_initialized():
        return
    world = dist.get_world_size()
    if len(ranks) != world:
        raise _error(
            f"new_group(ranks={ranks}, backend='symm'): symm is not started in this process. symm's runtime "
            f"spans the world ({world} ranks) and starts collectively, but the ranks outside this group do not "
            "take part in creating it: call symm.init() on every rank first (after init_process_group)"
        )
    _api.init()


class SymmBackend(_BackendBase):
    """A ``torch.distributed`` backend over symm's collectives: the world of symm's runtime
    (``group=None``) or one of its groups (a ``ProcessGroup`` symm knows)."""

    def __init__(
        self,
        rank: int,
        size: int,
        timeout: datetime.timedelta,
        group: Any,
        ranks: List[int],
        transport: Any = None,
    ) -> None:
        super().__init__(rank, size)
        #: What symm's calls get as ``group``: None for the world, else the ProcessGroup.
        self._group = group
        self._ranks = ranks
        self._timeout = _seconds(timeout)
        self._options = _C10dBackend.Options(NAME, timeout)
        self._where = f"the world (ranks 0..{size - 1})" if group is None else f"the group of global ranks {ranks}"
        #: symm's own bound on its waits (SYMMETRIC_MEMORY_TIMEOUT, read at its start).
        self._native_timeout = _api._current().comm.default_timeout
        self._window: Optional[_Window] = None
        #: The private Gloo group of the same members carrying the messages between hosts, when
        #: the members lie on several hosts (symm.hier composes the collectives); else None.
        self._inter = transport

    # -- what torch asks of every backend ------------------------------------------------
    def getBackendName(self) -> str:
        return NAME

    @property
    def options(self) -> Any:
        return self._options

    @property
    def supports_coalescing(self) -> bool:
        # batch_isend_irecv then hands its sends and receives over together, so that a send and
        # a receive between the same ranks can move at once (shmem_sendrecv).
        return True

    def shutdown(self) -> None:
        # symm's runtime belongs to the process, not to one group: it outlives the group. The
        # group's private transport between hosts goes with it.
        if self._inter is not None:
            drop_transport(self._group)

    def abort(self) -> None:
        pass

    # -- running operations ----------------------------------------------------------------
    def _bound(self, opts: Any) -> Optional[float]:
        t = getattr(opts, "timeout", _UNSET)
        return (_seconds(t) if t != _UNSET else None) or self._timeout

    def _run(
        self,
        op: str,
        opts: Any,
        calls: Sequence[Callable[[bool], Any]],
        outputs: List[torch.Tensor],
        finish: Sequence[Callable[[], None]] = (),
        async_op: Optional[bool] = None,
    ) -> SymmWork:
        """Issues ``calls`` (each one symm call: ``call(async_op)``), and returns the work that
        completes with ``finish`` run and ``outputs`` as its value."""
        bound = self._bound(opts)
        if async_op is None:
            async_op = bool(getattr(opts, "asyncOp", True))
        # symm's blocking call is bounded by its own timeout: when that is within the bound
        # asked for, the call runs blocking (the fast path); otherwise on symm's stream, waited
        # for with the bound. A group spanning hosts has no asynchronous form (symm.hier composes
        # symm in each node with messages between nodes on the calling thread): it always runs
        # blocking, bounded by SYMMETRIC_MEMORY_TIMEOUT, and its work is complete when returned.
        blocking = not async_op and self._window is None and bound is not None and bound >= self._native_timeout
        if blocking or self._inter is not None:
            try:
                # A process group's collectives record no autograd (Gloo's leave a tensor that
                # requires grad as it is); symm's own calls would record their backward.
                with torch.no_grad():
                    for call in calls:
                        call(False)
            except _symm.SymmError as e:
                raise _error(f"{op} on {self._where}: {type(e).__name__}: {e}", e) from e
            except RuntimeError as e:
                if self._inter is None:
                    raise
                # Between hosts, Gloo's error (a message not completed in time), named here.
                raise _error(f"{op} on {self._where}: {type(e).__name__}: {e}", e) from e
            return SymmWork(self._where, op, outputs, (), finish, bound)
        work = SymmWork(self._where, op, outputs, self._issue(op, calls), finish, bound)
        if self._window is not None:
            self._window.works.append(work)
        return work

    def _issue(self, op: str, calls: Sequence[Callable[[bool], Any]]) -> List[Any]:
        """symm's works of ``calls``, issued asynchronously (refused arguments raise here)."""
        try:
            with torch.no_grad():
                return [call(True) for call in calls]
        except _symm.SymmError as e:
            raise _error(f"{op} on {self._where}: {type(e).__name__}: {e}", e) from e

    def _reduce_op(self, opts: Any, op: str, dtype: torch.dtype) -> Tuple[Any, Optional[str]]:
        """``(torch's op type, symm's name for it or None when it is reduced here)``; refuses
        what cannot run, naming it."""
        red = opts.reduceOp.op
        if red in _NATIVE_OPS:
            return red, _NATIVE_OPS[red]
        if red == _RED.PREMUL_SUM:
            return red, "sum"
        if red in _LOCAL_OPS:
            if red in _BITWISE and (dtype.is_floating_point or dtype.is_complex):
                raise self._refuse(f"{op}: Cannot use {_op_name(red)} with non-integral dtype {dtype}")
            return red, None
        raise self._refuse(f"{op}: unsupported reduce op {_op_name(red)}")

    @staticmethod
    def _premul(opts: Any, t: torch.Tensor) -> None:
        factor = opts.reduceOp.factor
        t.mul_(factor if isinstance(factor, torch.Tensor) else float(factor))

    def _local_reduce(self, red: Any, parts: torch.Tensor, out: torch.Tensor) -> None:
        """``out`` = the reduction of ``parts`` (one row per group rank), in group-rank order."""
        rows = parts.view(self.size(), -1)
        flat = out.view(-1)
        flat.copy_(rows[0])
        fn = _LOCAL_OPS[red]
        for r in range(1, self.size()):
            fn(flat, rows[r], out=flat)

    # -- reductions ------------------------------------------------------------------------
    def allreduce(self, tensors: List[torch.Tensor], opts: Any) -> SymmWork:
        t = self._one(tensors, "tensors", "allreduce")
        finish: List[Callable[[], None]] = []
        buf = _contiguous_out(t, finish, keep=True)
        calls = self._allreduce_calls("allreduce", opts, buf, finish)
        return self._run("allreduce", opts, calls, [t], finish)

    def _allreduce_calls(
        self, op: str, opts: Any, buf: torch.Tensor, finish: List[Callable[[], None]]
    ) -> List[Callable[[bool], Any]]:
        """The symm call that all-reduces the contiguous ``buf`` in place (``finish`` gets the
        local part of a reduction done here, before any write-back already in it)."""
        red, native = self._reduce_op(opts, op, buf.dtype)
        g = self._group
        if native is not None:
            if red == _RED.PREMUL_SUM:
                self._premul(opts, buf)
            return [lambda a: _symm.shmem_allreduce(buf, native, g, async_op=a)]
        # Every member's data, then the same reduction on each, in group-rank order.
        gathered = buf.new_empty((self.size() * buf.numel(),))
        finish.insert(0, lambda: self._local_reduce(red, gathered, buf))
        return [lambda a: _symm.shmem_allgather(gathered, buf, g, async_op=a)]

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any) -> SymmWork:
        # One flat buffer per dtype: one symm call each instead of one per tensor.
        finish: List[Callable[[], None]] = []
        calls: List[Callable[[bool], Any]] = []
        by_dtype: Dict[torch.dtype, List[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        for group in by_dtype.values():
            flat = torch.cat([t.reshape(-1) for t in group])
            calls += self._allreduce_calls("allreduce_coalesced", opts, flat, finish)
            finish.append(lambda group=group, flat=flat: _split_into(flat, group))
        return self._run("allreduce_coalesced", opts, calls, list(tensors), finish)

    def reduce(self, tensors: List[torch.Tensor], opts: Any) -> SymmWork:
        t = self._one(tensors, "tensors", "reduce")
        root = self._root(opts, "reduce")
        finish: List[Callable[[], None]] = []
        red, native = self._reduce_op(opts, "reduce", t.dtype)
        g = self._group
        if native is not None:
            # The root reduces in place; the others contribute a copy and keep their tensor.
            buf = _contiguous_out(t, finish, keep=True) if self.rank() == root else t.contiguous().clone()
            if red == _RED.PREMUL_SUM:
                self._premul(opts, buf)
            calls = [lambda a: _symm.shmem_allreduce(buf, native, g, async_op=a)]
        else:
            calls = self._gather_calls("reduce", t.contiguous(), root, finish, reduce=(red, t))
        return self._run("reduce", opts, calls, [t], finish)

    def reduce_scatter(self, outputs: List[torch.Tensor], input_lists: List[List[torch.Tensor]], opts: Any) -> SymmWork:
        out = self._one(outputs, "output_tensors", "reduce_scatter")
        inputs = self._one(input_lists, "input_tensors", "reduce_scatter")
        self._check_count("reduce_scatter", "input_tensors", inputs)
        for i, t in enumerate(inputs):
            if t.numel() != out.numel():
                raise self._refuse(
                    f"reduce_scatter: input_tensors[{i}] has {t.numel()} elements, output_tensor {out.numel()}: "
                    "expected the same"
                )
        flat = torch.cat([t.reshape(-1) for t in inputs])
        return self._reduce_scatter("reduce_scatter", out, flat, opts, [out])

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> SymmWork:
        return self._reduce_scatter("reduce_scatter_tensor", output, input, opts, [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(
        self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any
    ) -> SymmWork:
        return self._many("reduce_scatter_tensor_coalesced", outputs, inputs, opts, self._reduce_scatter_calls)

    def _reduce_scatter(
        self, op: str, out: torch.Tensor, inp: torch.Tensor, opts: Any, outputs: List[torch.Tensor]
    ) -> SymmWork:
        finish: List[Callable[[], None]] = []
        calls = self._reduce_scatter_calls(op, out, inp, opts, finish)
        return self._run(op, opts, calls, outputs, finish)

    def _reduce_scatter_calls(
        self, op: str, out: torch.Tensor, inp: torch.Tensor, opts: Any, finish: List[Callable[[], None]]
    ) -> List[Callable[[bool], Any]]:
        red, native = self._reduce_op(opts, op, inp.dtype)
        g, n = self._group, self.size()
        buf = _contiguous_out(out, finish, keep=False)
        src = inp.contiguous()
        if native is not None:
            if red == _RED.PREMUL_SUM:
                src = src.clone()  # the caller's input stays as it was
                self._premul(opts, src)
            return [lambda a: _symm.shmem_reduce_scatter(buf, src, native, g, async_op=a)]
        if src.numel() != n * buf.numel():
            raise self._refuse(
                f"{op}: input_tensor has {src.numel()} elements, expected {n} x output_tensor's {buf.numel()}"
            )
        # Part r of every member goes to member r, which reduces the parts in group-rank order.
        parts = buf.new_empty((n * buf.numel(),))
        finish.insert(0, lambda: self._local_reduce(red, parts, buf))
        sends = list(src.reshape(-1).split(buf.numel()))
        counts = [buf.numel()] * n
        return [lambda a: _symm.shmem_alltoall(sends, parts, counts, g, async_op=a)]

    # -- gathers ---------------------------------------------------------------------------
    def allgather(self, output_lists: List[List[torch.Tensor]], inputs: List[torch.Tensor], opts: Any) -> SymmWork:
        outs = self._one(output_lists, "output_tensors", "allgather")
        inp = self._one(inputs, "input_tensors", "allgather")
        self._check_count("allgather", "output_tensors", outs)
        self._check_sizes("allgather", "output_tensors", outs, inp)
        src = _wire(inp.contiguous())
        gathered = src.new_empty((self.size() * src.numel(),))
        g = self._group
        finish = [lambda: _split_into(gathered, outs)]
        calls = [lambda a: _symm.shmem_allgather(gathered, src, g, async_op=a)]
        return self._run("allgather", opts, calls, list(outs), finish)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any) -> SymmWork:
        finish: List[Callable[[], None]] = []
        calls = self._allgather_calls("all_gather_into_tensor", output, input, opts, finish)
        return self._run("all_gather_into_tensor", opts, calls, [output], finish)

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(
        self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any
    ) -> SymmWork:
        return self._many("allgather_into_tensor_coalesced", outputs, inputs, opts, self._allgather_calls)

    def _allgather_calls(
        self, op: str, out: torch.Tensor, inp: torch.Tensor, opts: Any, finish: List[Callable[[], None]]
    ) -> List[Callable[[bool], Any]]:
        buf = _wire(_contiguous_out(out, finish, keep=False))
        src = _wire(inp.contiguous())
        g = self._group
        return [lambda a: _symm.shmem_allgather(buf, src, g, async_op=a)]

    def allgather_coalesced(
        self, output_lists: List[List[torch.Tensor]], inputs: List[torch.Tensor], opts: Any
    ) -> SymmWork:
        # output_lists[r][i] is input i of group rank r: the inputs travel as one buffer of
        # bytes (any mix of dtypes), gathered once.
        self._check_count("allgather_coalesced", "output_lists", output_lists)
        for r, outs in enumerate(output_lists):
            if len(outs) != len(inputs):
                raise self._refuse(
                    f"allgather_coalesced: output_lists[{r}] has {len(outs)} tensors, input_list {len(inputs)}: "
                    "expected the same"
                )
            self._check_sizes("allgather_coalesced", f"output_lists[{r}]", outs, *inputs)
        src = torch.cat(
            [torch.empty(0, dtype=torch.uint8, device=inputs[0].device if inputs else None)]
            + [t.contiguous().reshape(-1).view(torch.uint8) for t in inputs]
        )
        gathered = src.new_empty((self.size() * src.numel(),))
        g = self._group
        outputs = [t for outs in output_lists for t in outs]

        def finish() -> None:
            for r, outs in enumerate(output_lists):
                _split_into(gathered[r * src.numel() : (r + 1) * src.numel()], outs)

        calls = [lambda a: _symm.shmem_allgather(gathered, src, g, async_op=a)]
        return self._run("allgather_coalesced", opts, calls, outputs, [finish])

    def gather(self, output_lists: List[List[torch.Tensor]], inputs: List[torch.Tensor], opts: Any) -> SymmWork:
        inp = self._one(inputs, "input_tensors", "gather")
        root = self._root(opts, "gather")
        outs: List[torch.Tensor] = []
        if self.rank() == root:
            outs = self._one(output_lists, "output_tensors", "gather")
            self._check_count("gather", "output_tensors", outs)
            self._check_sizes("gather", "output_tensors", outs, inp)
        elif output_lists and any(output_lists):
            raise self._refuse(f"gather: output_tensors given on rank {self.rank()}, which is not the root ({root})")
        finish: List[Callable[[], None]] = []
        calls = self._gather_calls("gather", inp.contiguous(), root, finish, outs=outs)
        return self._run("gather", opts, calls, list(outs), finish)

    def _gather_calls(
        self,
        op: str,
        inp: torch.Tensor,
        root: int,
        finish: List[Callable[[], None]],
        outs: Sequence[torch.Tensor] = (),
        reduce: Optional[Tuple[Any, torch.Tensor]] = None,
    ) -> List[Callable[[bool], Any]]:
        """Every member's ``inp`` to ``root`` in one alltoall (the others send nothing to each
        other): split into ``outs`` there, or reduced into ``reduce``'s tensor in group-rank
        order."""
        n, me, g = self.size(), self.rank(), self._group
        src = inp if reduce is not None else _wire(inp)
        empty = src.new_empty((0,))
        sends = [src if r == root else empty for r in range(n)]
        if me == root:
            gathered = src.new_empty((n * src.numel(),))
            counts = [src.numel()] * n
            if reduce is not None:
                red, target = reduce
                staged = _contiguous_out(target, finish, keep=False)
                finish.insert(0, lambda: self._local_reduce(red, gathered, staged))
            else:
                finish.append(lambda: _split_into(gathered, outs))
        else:
            gathered, counts = empty, [0] * n
        return [lambda a: _symm.shmem_alltoall(sends, gathered, counts, g, async_op=a)]

    def scatter(self, outputs: List[torch.Tensor], input_lists: List[List[torch.Tensor]], opts: Any) -> SymmWork:
        out = self._one(outputs, "output_tensors", "scatter")
        root = self._root(opts, "scatter")
        finish: List[Callable[[], None]] = []
        buf = _wire(_contiguous_out(out, finish, keep=False))
        n, g = self.size(), self._group
        empty = buf.new_empty((0,))
        if self.rank() == root:
            ins = self._one(input_lists, "input_tensors", "scatter")
            self._check_count("scatter", "input_tensors", ins)
            self._check_sizes("scatter", "input_tensors", ins, out)
            sends = [_wire(t.contiguous()) for t in ins]
        else:
            if input_lists and any(input_lists):
                raise self._refuse(
                    f"scatter: input_tensors given on rank {self.rank()}, which is not the root ({root})"
                )
            sends = [empty] * n
        counts = [buf.numel() if r == root else 0 for r in range(n)]
        calls = [lambda a: _symm.shmem_alltoall(sends, buf, counts, g, async_op=a)]
        return self._run("scatter", opts, calls, [out], finish)

    # -- all-to-all ------------------------------------------------------------------------
    def alltoall(self, outputs: List[torch.Tensor], inputs: List[torch.Tensor], opts: Any) -> SymmWork:
        self._check_count("alltoall", "output_tensor_list", outputs)
        self._check_count("alltoall", "input_tensor_list", inputs)
        sends = [_wire(t.contiguous()) for t in inputs]
        # Counted in what symm moves: the outputs' elements, or their bytes.
        counts = [_wire_numel(t) for t in outputs]
        received = sends[0].new_empty((sum(counts),))
        g = self._group
        finish = [lambda: _split_into(received, outputs)]
        calls = [lambda a: _symm.shmem_alltoall(sends, received, counts, g, async_op=a)]
        return self._run("alltoall", opts, calls, list(outputs), finish)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: List[int],
        input_split_sizes: List[int],
        opts: Any,
    ) -> SymmWork:
        in_splits = self._splits("input_split_sizes", input_split_sizes, input)
        out_splits = self._splits("output_split_sizes", output_split_sizes, output)
        finish: List[Callable[[], None]] = []
        buf = _contiguous_out(output, finish, keep=False)
        # Rows of dim 0, counted in what symm moves (elements, or bytes); the pieces of a
        # contiguous tensor along dim 0 are contiguous views.
        flat_in = _wire(input.contiguous()).reshape(-1)
        flat_out = _wire(buf).reshape(-1)
        in_row = flat_in.numel() // sum(in_splits) if sum(in_splits) else 0
        out_row = flat_out.numel() // sum(out_splits) if sum(out_splits) else 0
        sends = list(flat_in.split([s * in_row for s in in_splits]))
        counts = [s * out_row for s in out_splits]
        g = self._group
        calls = [lambda a: _symm.shmem_alltoall(sends, flat_out, counts, g, async_op=a)]
        return self._run("all_to_all_single", opts, calls, [output], finish)

    alltoall_base = all_to_all_single

    def _splits(self, arg: str, splits: Sequence[int], t: torch.Tensor) -> List[int]:
        n = self.size()
        rows = t.shape[0] if t.dim() else 1
        if not splits:
            if rows % n:
                raise self._refuse(
                    f"all_to_all_single: Tensor's dim 0 ({rows}) does not divide equally across group size {n}"
                )
            return [rows // n] * n
        if len(splits) != n:
            raise self._refuse(f"all_to_all_single: {arg} = {list(splits)}: expected {n} entries (one per group rank)")
        if sum(splits) != rows or any(s < 0 for s in splits):
            raise self._refuse(
                f"all_to_all_single: {arg} = {list(splits)}: Split sizes doesn't match total dim 0 size ({rows})"
            )
        return list(splits)

    # -- broadcast, barrier ----------------------------------------------------------------
    def broadcast(self, tensors: List[torch.Tensor], opts: Any) -> SymmWork:
        t = self._one(tensors, "tensors", "broadcast")
        root = self._root(opts, "broadcast")
        finish: List[Callable[[], None]] = []
        buf = _wire(_contiguous_out(t, finish, keep=True))
        g = self._group
        calls = [lambda a: _symm.shmem_broadcast(buf, root, g, async_op=a)]
        return self._run("broadcast", opts, calls, [t], finish)

    def barrier(self, opts: Any) -> SymmWork:
        g = self._group
        bound = self._bound(opts)
        blocking = not opts.asyncOp and self._window is None and bound is not None and bound >= self._native_timeout
        if blocking or self._inter is not None:
            # (spanning hosts: symm.hier's barrier, the node's then the private Gloo group's)
            try:
                _api.barrier(g)
            except _symm.SymmError as e:
                raise _error(f"barrier on {self._where}: {type(e).__name__}: {e}", e) from e
            except RuntimeError as e:
                if self._inter is None:
                    raise
                raise _error(f"barrier on {self._where}: {type(e).__name__}: {e}", e) from e
            return SymmWork(self._where, "barrier", [], timeout=bound)
        # symm's barrier has no asynchronous form: an allreduce of one element is one (every
        # member must have issued it, after everything it issued before on the stream).
        token = torch.zeros(1, dtype=torch.int32)
        calls = [lambda a: _symm.shmem_allreduce(token, "sum", g, async_op=a)]
        return self._run("barrier", opts, calls, [], async_op=True)

    # -- messages --------------------------------------------------------------------------
    def send(self, tensors: List[torch.Tensor], dst: int, tag: int = 0) -> SymmWork:
        # Tags do not select messages: messages between two ranks are received in the order
        # they were sent (as with NCCL). symm's send is asynchronous here: torch's isend must not
        # block, and dist.send waits for the work.
        src = self._one(tensors, "tensors", "send", collective=False)
        return self._p2p("send", _wire(src.contiguous()), dst, [], [src])

    def recv(self, tensors: List[torch.Tensor], src: int, tag: int = 0) -> SymmWork:
        out = self._one(tensors, "tensors", "recv", collective=False)
        finish: List[Callable[[], None]] = []
        buf = _wire(_contiguous_out(out, finish, keep=False))
        return self._p2p("recv", buf, src, finish, [out])

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> SymmWork:
        raise _error(
            "recv from any source (dist.recv(tensor, src=None)): unsupported: symm receives from a named rank; pass src"
        )

    def _p2p(
        self, kind: str, t: torch.Tensor, peer: int, finish: List[Callable[[], None]], outputs: List[torch.Tensor]
    ) -> SymmWork:
        g = self._group
        if self._window is not None:
            # Issued when the window ends (end_coalescing), paired with a receive if there is one.
            work = SymmWork(self._where, kind, outputs, (), (), self._timeout)
            work._window = self._window
            self._window.p2p.append((kind, t, peer, finish, work))
            return work
        if self._inter is not None:
            return SymmWork(self._where, kind, outputs, [self._spanning_p2p(kind, t, peer)], finish, self._timeout)
        fn = _symm.shmem_send if kind == "send" else _symm.shmem_recv
        return self._run(kind, None, [lambda a: fn(t, peer, g, async_op=a)], outputs, finish, async_op=True)

    def _spanning_p2p(self, kind: str, t: torch.Tensor, peer: int) -> Any:
        """A send or receive on a group spanning hosts, started and not waited for (torch's
        isend must not block, and a blocking send waits for its receive: a ring of them would
        wait for each other): symm's asynchronous one on the node's group when the peer is on
        this host, else a message on the private Gloo group (tag P2P_TAG: never matched with
        symm.hier's messages of the collectives)."""
        try:
            st = _api._current()
            topo = hier.topology(st, self._group)
            if not 0 <= peer < topo.size:
                raise _error(f"{kind} on {self._where}: peer rank {peer} is outside the group of {topo.size} ranks")
            if topo.node_of[peer] == topo.my_node:
                fn = _symm.shmem_send if kind == "send" else _symm.shmem_recv
                with torch.no_grad():
                    return fn(t, topo.local_of[peer], group=topo.node, async_op=True)
            raw = [t.reshape(-1).view(torch.uint8)]
            work = self._inter.send(raw, peer, P2P_TAG) if kind == "send" else self._inter.recv(raw, peer, P2P_TAG)
        except _symm.SymmError as e:
            raise _error(f"{kind} on {self._where}: {type(e).__name__}: {e}", e) from e
        what = f"{kind} {'to' if kind == 'send' else 'from'} group rank {peer} (on another host)"
        return _GlooPart(work, what, st.comm.rank, self._native_timeout)

    def start_coalescing(self) -> None:
        if self._window is not None:
            raise _error(f"start_coalescing on {self._where}: a coalescing window is open already")
        self._window = _Window()

    def end_coalescing(self) -> SymmWork:
        window = self._window
        if window is None:
            raise _error(f"end_coalescing on {self._where}: no coalescing window is open")
        self._window = None
        recvs = [p for p in window.p2p if p[0] == "recv"]
        g: Any = self._group
        at: Callable[[int], int] = lambda r: r  # noqa: E731 - a peer's rank in g
        paired = window.p2p
        started: List[Any] = []
        if self._inter is not None:
            # Spanning hosts: the messages to and from other hosts go on the private Gloo group,
            # each started on its own before any is waited for; those inside this node are
            # paired below on the node's group, where symm runs them asynchronously.
            topo = hier.topology(_api._current(), g)
            here = [0 <= p[2] < topo.size and topo.node_of[p[2]] == topo.my_node for p in window.p2p]
            started = [self._spanning_p2p(p[0], p[1], p[2]) for p, h in zip(window.p2p, here) if not h]
            paired = [p for p, h in zip(window.p2p, here) if h]
            g, at = topo.node, lambda r: topo.local_of[r]
        sends = [p for p in paired if p[0] == "send"]
        local_recvs = [p for p in paired if p[0] == "recv"]
        calls: List[Callable[[bool], Any]] = []
        finish: List[Callable[[], None]] = []
        # The k-th send and the k-th receive move together (shmem_sendrecv): ranks that send to
        # each other and then receive make progress at any size (a ring, a pairwise exchange).
        for k in range(max(len(sends), len(local_recvs))):
            s = sends[k] if k < len(sends) else None
            r = local_recvs[k] if k < len(local_recvs) else None
            if s is not None and r is not None:
                calls.append(
                    lambda a, s=s, r=r: _symm.shmem_sendrecv(s[1], at(s[2]), r[1], at(r[2]), g, async_op=a)
                )
            elif s is not None:
                calls.append(lambda a, s=s: _symm.shmem_send(s[1], at(s[2]), g, async_op=a))
            elif r is not None:
                calls.append(lambda a, r=r: _symm.shmem_recv(r[1], at(r[2]), g, async_op=a))
        for p in recvs:
            finish += p[3]
        outputs = [t for p in recvs for t in p[4]._outputs]

        def collectives_done() -> None:
            # The window's collectives ran at once; its work completes with them too.
            for w in window.works:
                w._settle(None)
                if w._exc is not None:
                    raise w._exc

        parts = [part for w in window.works for part in w._parts] + started + self._issue("coalesced", calls)
        window.work = SymmWork(self._where, "coalesced", outputs, parts, finish + [collectives_done], self._timeout)
        return window.work

    # -- argument checks (Gloo's messages, naming the argument) ----------------------------
    def _refuse(self, text: str, collective: bool = True) -> Exception:
        """The error of an argument refused here. In a collective this rank still takes part in
        the group's round to reject it (as symm's own checks do), so that its peers fail at
        once with PeerRejected instead of waiting for it until the timeout. Not on a group
        spanning hosts: there the peers run symm.hier's composition, not symm's round (they
        refuse the same arguments themselves, or wait until SYMMETRIC_MEMORY_TIMEOUT)."""
        if collective and self._inter is None:
            st = _api._current()
            try:
                st.comm.reject(_api._native_group(st, self._group))
            except _symm.SymmError:
                pass  # the group itself is unusable: the peers see that too
        return _error(text)

    def _one(self, tensors: Sequence[Any], arg: str, op: str, collective: bool = True) -> Any:
        """The single entry of a per-device list (torch passes one: several devices per process
        are gone from torch.distributed)."""
        if len(tensors) != 1:
            raise self._refuse(
                f"{op}: {arg} = a list of {len(tensors)} entries: expected exactly one (one tensor per process)",
                collective,
            )
        return tensors[0]

    def _root(self, opts: Any, op: str) -> int:
        root = int(opts.rootRank)
        if not 0 <= root < self.size():
            raise self._refuse(f"{op}: invalid root rank: {root} (rootRank of a group of {self.size()})")
        return root

    def _check_count(self, op: str, arg: str, tensors: Sequence[Any]) -> None:
        if len(tensors) != self.size():
            raise self._refuse(f"{op}: {arg} has {len(tensors)} entries: expected {self.size()} (the group size)")

    def _check_sizes(self, op: str, arg: str, tensors: Sequence[torch.Tensor], *like: torch.Tensor) -> None:
        for i, t in enumerate(tensors):
            want = like[i % len(like)] if like else t
            if t.numel() != want.numel() or t.dtype != want.dtype:
                raise self._refuse(
                    f"{op}: invalid tensor size at index {i} of {arg} (expected {tuple(want.shape)} x {want.dtype}, "
                    f"got {tuple(t.shape)} x {t.dtype})"
                )

    def _many(
        self,
        op: str,
        outputs: List[torch.Tensor],
        inputs: List[torch.Tensor],
        opts: Any,
        calls_of: Callable[..., List[Callable[[bool], Any]]],
    ) -> SymmWork:
        if len(outputs) != len(inputs):
            raise self._refuse(f"{op}: {len(outputs)} outputs for {len(inputs)} inputs: expected one output per input")
        finish: List[Callable[[], None]] = []
        calls: List[Callable[[bool], Any]] = []
        for out, inp in zip(outputs, inputs):
            calls += calls_of(op, out, inp, opts, finish)
        return self._run(op, opts, calls, list(outputs), finish)


def _split_into(flat: torch.Tensor, outs: Sequence[torch.Tensor]) -> None:
    """Copies consecutive pieces of the 1-D ``flat`` into ``outs``: as many elements as each
    holds, or as many bytes when ``flat`` holds bytes of another dtype (data moved as bytes)."""
    offset = 0
    for t in outs:
        n = t.numel() if flat.dtype == t.dtype else t.numel() * t.element_size()
        piece = flat[offset : offset + n]
        t.copy_((piece if flat.dtype == t.dtype else piece.view(t.dtype)).view(t.shape))
        offset += n


def _create(opts: Any, backend_options: Any) -> SymmBackend:
    """The factory torch calls (``extended_api=True``) for every group built with ``"symm"``."""
    ranks = list(opts.global_ranks_in_group)
    rank, size, timeout = opts.group_rank, opts.group_size, opts.timeout
    try:
        if not ranks:
            # The default group (init_process_group): symm starts over this world.
            _start_world(opts.store, rank, size, timeout)
            group = None
            ranks = list(range(size))
        else:
            _start_for_group(ranks)
            group = opts.process_group
            _register_group(group, ranks)
        st = _api._current()
        transport = None
        warm = group
        if _api._native_group(st, group).spans_hosts:
            transport = _transport(opts.store, rank, size, timeout, group, ranks)
            warm = hier.topology(st, group).node
        # The group's first collective allocates its workspace, collectively: done here, where
        # every member takes part, so that a first send/recv between two members cannot be it
        # (spanning hosts: the workspace of this rank's node, where symm runs).
        _symm.shmem_allreduce(torch.empty(0), "sum", warm)
    except _symm.SymmError as e:
        raise _error(
            f"creating the group of global ranks {ranks or list(range(size))}: {type(e).__name__}: {e}", e
        ) from e
    return SymmBackend(rank, size, timeout, group, ranks, transport)


def _transport(store: Any, rank: int, size: int, timeout: datetime.timedelta, group: Any, ranks: List[int]) -> Any:
    """The private Gloo group of a "symm" group whose members lie on several hosts: symm.hier's
    messages between nodes travel on it (the group's own send would come back into symm). Made
    here, in the backend's creation, where every member takes part (making a Gloo group is
    collective), over the group's store, ranks and timeout; registered with the torch platform,
    whose messages between nodes then use it for this group."""
    if not dist.is_gloo_available():
        raise _error(
            f"creating the group of global ranks {ranks or list(range(size))}: its members lie on several hosts "
            "and symm moves data between hosts over a private Gloo group, but this torch has no Gloo"
        )
    pg = dist.ProcessGroupGloo(dist.PrefixStore("symm-inter/", store), rank, size, timeout)
    set_transport(group, pg, timeout)
    return pg


def _register_group(group: Any, ranks: List[int]) -> None:
    """Tells symm which of its native groups serves ``group`` (torch registers the group only
    after the backend exists, so symm cannot ask torch for its members yet)."""
    st = _api._current()
    key = st.platform.group_key(group)
    if key in st.groups:
        return
    outside = [r for r in ranks if r not in st.native_of]
    if outside:
        raise _error(
            f"new_group(ranks={ranks}, backend='symm'): ranks {outside} are outside the ranks symm runs on ({st.ranks})"
        )
    st.groups[key] = st.comm.group([st.native_of[r] for r in ranks])


def register() -> None:
    """Registers the backend with ``torch.distributed`` under ``"symm"`` (idempotent); also the
    entry point ``torch.distributed.backends`` torch loads when it meets the name first."""
    if not dist.is_available():
        return
    devices = ["cpu"] + (["npu"] if "ascend" in _symm.BACKENDS else [])
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=devices)
