"""``python -m symm.perf``: the collectives through symm, torch.distributed (gloo), MPI and
DeepSpeed's CPU allreduce, side by side, in the style of nccl-tests.

For each operation and size the same exchange runs through each backend, ``-w`` warm-up
iterations, then ``-n`` timed ones; a line gives the time per iteration (the slowest rank's
average, microseconds) and the bus bandwidth of each backend, the ratio of symm's bus bandwidth
to each peer's (above 1: symm is faster), and ``#wrong``, the elements that differ from the expected
result in a checked run after the timing (all backends together).

``-r R`` measures each size R times, the backends taking turns (symm, gloo, symm, gloo, ...), so
that a burst of noise on a shared machine hits one run of one backend, not a whole column: the
time columns then show each backend's best run, the ratio columns the ratio of those best times,
and for each ratio a column ``<ratio> med``, the median over the R runs of the ratio within each
run (both backends measured back to back). ``#wrong`` adds up the checks of every run.

Sizes are bytes, as in nccl-tests: the buffer of all_reduce, broadcast and sendrecv, and the
*total* array of reduce_scatter, all_gather and alltoall (count per rank x ranks x dtype size).
``algbw = size / time``; ``busbw = algbw x factor``, with factor ``2(n-1)/n`` for all_reduce,
``(n-1)/n`` for reduce_scatter, all_gather and alltoall, ``1`` for broadcast and sendrecv.

symm's buffers are symmetric tensors (``symm.empty``: peers read them in place); gloo's and
MPI's are ordinary tensors. symm's alltoall gets its ``receive_list`` as an int64 tensor (the
RFC's form, as HyperParallel passes it). sendrecv is a ring (send to rank + 1, receive from rank - 1), both
directions at once in every backend: ``shmem_sendrecv``, gloo's ``isend``/``irecv``, MPI's
``Sendrecv``.

Launching: by default the command spawns ``-g`` ranks itself (gloo process group on a free
port of 127.0.0.1). Under ``torchrun`` (``RANK``/``WORLD_SIZE`` set) it uses those ranks. The
MPI columns appear when the ranks were started by an MPI launcher and ``mpi4py`` imports
(``mpirun -n 2 python -m symm.perf``; it needs numpy too, or it refuses to start); otherwise
they are left out silently.

``--backends`` picks the backends (e.g. ``--backends symm`` for symm alone; default
symm,gloo,mpi). ``deepspeed``, asked for by name, adds DeepSpeed's shared-memory allreduce for
CPUs (the kernel of ``deepspeed.comm.inference_all_reduce``, called directly: in place, sum,
all_reduce only; float32 needs AVX2, bfloat16 and float16 AVX-512, as DeepSpeed itself decides)
and the ratio ``symm/deepspeed``; it needs ``pip install deepspeed ninja`` and builds its kernel
on first use. Each ratio ``symm/<peer>`` is the peer's time over symm's. The core's own time
for the same calls is ``symm-bench``'s (docs/performance.md).

Memory-bandwidth bound (the one model ``symm-bench`` reports too, ``symm_registry::host::membw`` through
``_symm.memory_bound``): before the operations rank 0 measures the host's memory rates
STREAM-style (reading, writing and copying by working-set size, one thread and ``min(ranks,
CPUs)`` pinned threads) while the others wait, and prints them. ``bound(us)`` is the least time of
the bytes each operation must read and write at those rates (each input byte read once, each
output byte written once, the work shared by the ranks; all_reduce in place, as every backend
here runs it): no call can take less. ``<backend> %bnd`` is ``bound / time``.
docs/performance.md, "The memory-bandwidth bound", has the model. ``--bound 0`` leaves the
measurement and the columns out.

``--json FILE`` saves the run (every backend's time per operation and size, and the bound) as
JSON; ``--plot FILE`` draws busbw against size, one panel per operation, every backend and the
bound, into an image file (PNG, SVG, PDF: by the suffix). ``--plot`` draws the run just made, or
with ``--from FILE`` a run saved by ``--json`` without running anything. It needs matplotlib
(``pip install 'symm[plot]'``).

``--async-op`` times the asynchronous forms: every symm and gloo call is made with
``async_op=True`` and its work waited for at once (``work.wait()``), so a row shows what an
operation costs through a stream (symm: the communicator's progress thread) instead of on the
calling thread; MPI and DeepSpeed run as without it (gloo's sendrecv ring is ``isend``/``irecv``
either way).

``SYMMETRIC_MEMORY_HEAP_SIZE`` defaults to what the largest size needs when it is not set.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import socket
import statistics
import sys
import time
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

OPS = ("all_reduce", "reduce_scatter", "all_gather", "alltoall", "sendrecv", "broadcast")
BACKENDS = ("symm", "gloo", "mpi", "deepspeed")
#: The backends run when ``--backends`` is not given (deepspeed is asked for by name: loading it
#: builds its kernel the first time).
DEFAULT_BACKENDS = ("symm", "gloo", "mpi")
#: Ratio columns: name -> (time a, time b, meaning); the column is time a / time b, shown when
#: both backends run.
RATIOS = {
    "symm/gloo": ("gloo", "symm", "busbw ratio (> 1: symm faster)"),
    "symm/mpi": ("mpi", "symm", "busbw ratio (> 1: symm faster)"),
    "symm/deepspeed": ("deepspeed", "symm", "busbw ratio (> 1: symm faster)"),
}
DTYPES = ("float32", "float64", "float16", "bfloat16", "int32", "int64")
#: The operations every backend here runs in place (the others out of place).
IN_PLACE = ("all_reduce",)


def parse_size(text: str) -> int:
    t = text.strip().upper().rstrip("B")
    mult = 1
    for suffix, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if t.endswith(suffix):
            t, mult = t[:-1], m
            break
    try:
        value = int(float(t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected bytes, e.g. 8, 64K, 16M") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be >= 0")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m symm.perf",
        description="symm collectives next to torch.distributed (gloo) and MPI, nccl-tests style.",
    )
    p.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("1K"), help="smallest size (default 1K)")
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("16M"), help="largest size (default 16M)")
    p.add_argument("-f", "--stepfactor", type=int, default=4, help="multiplication factor between sizes (default 4)")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed iterations (default 20)")
    p.add_argument("-w", "--warmup_iters", type=int, default=5, help="warm-up iterations (default 5)")
    p.add_argument("-g", "--ranks", type=int, default=2, help="ranks to spawn when not launched (default 2)")
    p.add_argument("-o", "--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    p.add_argument("-d", "--dtype", default="float32", choices=DTYPES, help="element type (default float32)")
    p.add_argument("-c", "--check", type=int, default=1, help="check the results (1, default) or not (0)")
    p.add_argument(
        "-r",
        "--runs",
        type=int,
        default=1,
        help="measure each size this many times, the backends taking turns; show the best time and "
        "the median of the paired ratios (default 1)",
    )
    p.add_argument(
        "--backends",
        default=",".join(DEFAULT_BACKENDS),
        help=f"comma-separated subset of {','.join(BACKENDS)} (default: {','.join(DEFAULT_BACKENDS)}; mpi only "
        "under an MPI launcher; deepspeed, its shared-memory allreduce, needs deepspeed and ninja installed)",
    )
    p.add_argument(
        "--pin",
        type=int,
        default=0,
        help="1: pin rank r to allowed CPU r %% CPUs after start-up, as symm-bench --pin 1 does (default 0)",
    )
    p.add_argument(
        "--bound",
        type=int,
        default=1,
        help="1 (default): measure the copy bandwidth and print each size's memory-bandwidth bound and %% reached",
    )
    p.add_argument(
        "--async-op",
        action="store_true",
        help="make every symm and gloo call with async_op=True and wait() for its work at once",
    )
    p.add_argument(
        "--ddp",
        action="store_true",
        help='instead of the collectives: a DDP training step over torch.distributed\'s backend "symm" and over '
        '"gloo", end to end (symm/perf_ddp.py; -n steps after -w warm-up, -r runs, -g ranks)',
    )
    p.add_argument("--ddp-width", type=int, default=1024, help="--ddp: features of each square layer (default 1024)")
    p.add_argument("--ddp-layers", type=int, default=8, help="--ddp: layers of the MLP (default 8)")
    p.add_argument("--ddp-batch", type=int, default=8, help="--ddp: samples per step and rank (default 8)")
    p.add_argument(
        "--ddp-bucket-view",
        action="store_true",
        help="--ddp: gradient_as_bucket_view=True for every model (gradients live in DDP's buckets)",
    )
    p.add_argument(
        "--hosts",
        type=int,
        default=1,
        help="simulate this many hosts (SYMM_HOST_ID, spawned ranks in consecutive blocks): symm's collectives "
        "then run hierarchically (symm in each host, gloo between hosts) on ordinary tensors (default 1)",
    )
    p.add_argument("--json", metavar="FILE", help="save the run (times and bounds) as JSON in FILE")
    p.add_argument(
        "--plot",
        metavar="FILE",
        help="draw busbw against size (every backend and the bound, one panel per operation) into FILE; "
        "needs matplotlib (pip install 'symm[plot]')",
    )
    p.add_argument(
        "--from",
        dest="saved",
        metavar="FILE",
        help="with --plot: draw the run saved in FILE by --json instead of running",
    )
    return p


def validate(args: argparse.Namespace) -> None:
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    unknown = [o for o in ops if o not in OPS]
    if unknown or not ops:
        raise SystemExit(f"symm.perf: -o {args.ops!r}: unknown operations {unknown}; accepted: {', '.join(OPS)}")
    args.ops = ops
    if args.stepfactor < 2:
        raise SystemExit(f"symm.perf: -f {args.stepfactor}: the step factor must be >= 2")
    if args.iters < 1 or args.warmup_iters < 0:
        raise SystemExit("symm.perf: -n must be >= 1 and -w >= 0")
    if args.runs < 1:
        raise SystemExit(f"symm.perf: -r {args.runs}: needs at least 1 run")
    if args.ranks < 2:
        raise SystemExit(f"symm.perf: -g {args.ranks}: needs at least 2 ranks")
    if args.minbytes > args.maxbytes:
        raise SystemExit(f"symm.perf: -b {args.minbytes} is larger than -e {args.maxbytes}")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = [b for b in backends if b not in BACKENDS]
    if unknown or not backends:
        raise SystemExit(
            f"symm.perf: --backends {args.backends!r}: unknown backends {unknown}; accepted: {', '.join(BACKENDS)}"
        )
    args.backends = backends
    missing = [m for m in ("deepspeed", "ninja") if "deepspeed" in backends and importlib.util.find_spec(m) is None]
    if missing:
        raise SystemExit(
            f"symm.perf: --backends deepspeed: {' and '.join(missing)} not installed (pip install deepspeed ninja: "
            "DeepSpeed builds its allreduce kernel with ninja on first use)"
        )
    if args.pin not in (0, 1):
        raise SystemExit(f"symm.perf: --pin {args.pin}: expected 0 or 1")
    if args.hosts < 1 or args.hosts > args.ranks:
        raise SystemExit(f"symm.perf: --hosts {args.hosts}: expected 1 to -g {args.ranks}")
    if args.hosts > 1 and args.async_op:
        raise SystemExit("symm.perf: --hosts with --async-op: groups spanning hosts run blocking only")
    if args.bound not in (0, 1):
        raise SystemExit(f"symm.perf: --bound {args.bound}: expected 0 or 1")
    if min(args.ddp_width, args.ddp_layers, args.ddp_batch) < 1:
        raise SystemExit("symm.perf: --ddp-width, --ddp-layers and --ddp-batch must be >= 1")
    if args.saved and not args.plot:
        raise SystemExit(f"symm.perf: --from {args.saved}: draws a saved run, it needs --plot FILE")
    if args.plot:
        _pyplot()  # before the run: a missing matplotlib is an error now, not after the measurement


def sizes(args: argparse.Namespace) -> List[int]:
    out, s = [], max(args.minbytes, 1)
    while s <= args.maxbytes:
        out.append(s)
        s *= args.stepfactor
    return out


def best_times(runs: Sequence[Sequence[float]]) -> List[float]:
    """Each backend's best (smallest) time over the runs (``runs[r][b]``: run r, backend b);
    NaN for a backend that does not run the operation (NaN in every run)."""
    return [min((t for t in col if not math.isnan(t)), default=math.nan) for col in zip(*runs)]


def paired_median(runs: Sequence[Sequence[float]], a: int, b: int) -> float:
    """The median over the runs of ``time a / time b`` within each run (NaN when either backend
    does not run the operation)."""
    ratios = [r[a] / r[b] for r in runs]
    return math.nan if any(math.isnan(x) for x in ratios) else statistics.median(ratios)


def bus_factor(op: str, n: int) -> float:
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("reduce_scatter", "all_gather", "alltoall"):
        return (n - 1) / n
    return 1.0


# --------------------------------------------------------------------------------------------
# one rank
# --------------------------------------------------------------------------------------------


def call_loop(step: Callable[[], Any], iters: int) -> float:
    """Seconds taken by ``iters`` calls of ``step``; a ``partial`` with up to six positional
    arguments (and no keywords) is called as its function with those arguments, spelled out
    (a subclass of ``partial``, whose call may differ, is called as it is)."""
    if not (type(step) is partial and not step.keywords and len(step.args) <= 6):
        t0 = time.perf_counter()
        for _ in range(iters):
            step()
        return time.perf_counter() - t0
    fn, args = step.func, step.args
    a = args + (None,) * (6 - len(args))
    a0, a1, a2, a3, a4, a5 = a
    t0 = time.perf_counter()
    if len(args) == 0:
        for _ in range(iters):
            fn()
    elif len(args) == 1:
        for _ in range(iters):
            fn(a0)
    elif len(args) == 2:
        for _ in range(iters):
            fn(a0, a1)
    elif len(args) == 3:
        for _ in range(iters):
            fn(a0, a1, a2)
    elif len(args) == 4:
        for _ in range(iters):
            fn(a0, a1, a2, a3)
    elif len(args) == 5:
        for _ in range(iters):
            fn(a0, a1, a2, a3, a4)
    else:
        for _ in range(iters):
            fn(a0, a1, a2, a3, a4, a5)
    return time.perf_counter() - t0


class Backend:
    """One way to run the operations: ``alloc`` makes the buffers of one (op, count), the
    callable ``run`` returns runs one iteration, ``loop`` times iterations of it. A single call
    is returned as a ``functools.partial`` of the API function with positional arguments, which
    ``loop`` unpacks: the loop calls the function itself, as a user's code does, without a
    Python frame of the harness or the partial's own call (~15 ns) around it."""

    name = "?"

    def alloc(self, numel: int) -> Any:
        """A buffer of ``numel`` elements of the run's dtype (an ordinary tensor unless the
        backend needs its own memory)."""
        import torch

        return torch.empty(numel, dtype=DT)

    def run(self, op: str, bufs: Dict[str, Any], rank: int, n: int) -> Optional[Callable[[], Any]]:
        """One iteration of ``op`` on ``bufs`` (``send``, ``recv``, ``count``); None when the
        backend does not run ``op`` (its columns show N/A)."""
        raise NotImplementedError

    def loop(self, step: Callable[[], Any], iters: int) -> float:
        """Seconds taken by ``iters`` iterations of ``step``."""
        return call_loop(step, iters)

    def release(self, t: Any) -> None:
        pass

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()


class SymmBackend(Backend):
    name = "symm"

    def __init__(self, hosts: int = 1) -> None:
        #: Several (simulated) hosts: no symmetric allocation spans them, the collectives run
        #: on ordinary tensors (hierarchically, symm.hier).
        self.hosts = hosts

    def alloc(self, numel: int) -> Any:
        import symm

        if self.hosts > 1:
            import torch

            return torch.empty(numel, dtype=DT)
        return symm.empty(numel, DT)

    def release(self, t: Any) -> None:
        import symm

        if self.hosts == 1:
            symm.free(t)

    def barrier(self) -> None:
        # symm's own barrier: ranks leave it within a fraction of a microsecond of each other.
        # Gloo's (TCP) lets them leave up to milliseconds apart, and the first timed call then
        # waits that skew out: 200 iterations of an 8-byte allgather measured 11 us each
        # instead of 0.3.
        import symm

        symm.barrier()

    def run(self, op: str, bufs: Dict[str, Any], rank: int, n: int) -> Optional[Callable[[], Any]]:
        import symm

        send, recv = bufs["send"], bufs["recv"]
        c = bufs["count"]
        if op == "alltoall":
            import torch

            parts = [send[i * c : (i + 1) * c] for i in range(n)]
            # The RFC's form, as HyperParallel passes it: the counts as an int64 tensor.
            counts = torch.full((n,), c, dtype=torch.int64)
            return partial(symm.shmem_alltoall, parts, recv, counts)
        return {
            "all_reduce": partial(symm.shmem_allreduce, recv),
            "reduce_scatter": partial(symm.shmem_reduce_scatter, recv, send),
            "all_gather": partial(symm.shmem_allgather, recv, send),
            "broadcast": partial(symm.shmem_broadcast, recv, 0),
            "sendrecv": partial(symm.shmem_sendrecv, send, (rank + 1) % n, recv, (rank - 1) % n),
        }[op]


class GlooBackend(Backend):
    name = "gloo"

    def run(self, op: str, bufs: Dict[str, Any], rank: int, n: int) -> Callable[[], Any]:
        import torch.distributed as dist

        send, recv = bufs["send"], bufs["recv"]
        nxt, prv = (rank + 1) % n, (rank - 1) % n

        def ring() -> None:
            reqs = [dist.isend(send, nxt), dist.irecv(recv, prv)]
            for r in reqs:
                if r is not None:
                    r.wait()

        return {
            "all_reduce": partial(dist.all_reduce, recv),
            "reduce_scatter": partial(dist.reduce_scatter_tensor, recv, send),
            "all_gather": partial(dist.all_gather_into_tensor, recv, send),
            "alltoall": partial(dist.all_to_all_single, recv, send),
            "broadcast": partial(dist.broadcast, recv, 0),
            "sendrecv": ring,
        }[op]


class MpiBackend(Backend):
    name = "mpi"

    def __init__(self, comm: Any) -> None:
        self.comm = comm

    def barrier(self) -> None:
        self.comm.Barrier()

    def run(self, op: str, bufs: Dict[str, Any], rank: int, n: int) -> Callable[[], Any]:
        from mpi4py import MPI  # type: ignore[import-not-found, unused-ignore]

        comm = self.comm
        send, recv = bufs["send"].numpy(), bufs["recv"].numpy()
        nxt, prv = (rank + 1) % n, (rank - 1) % n
        return {
            "all_reduce": partial(comm.Allreduce, MPI.IN_PLACE, recv),
            "reduce_scatter": partial(comm.Reduce_scatter_block, send, recv),
            "all_gather": partial(comm.Allgather, send, recv),
            "alltoall": partial(comm.Alltoall, send, recv),
            "broadcast": partial(comm.Bcast, recv, 0),
            "sendrecv": partial(comm.Sendrecv, send, nxt, 0, recv, prv, 0),
        }[op]


class DeepSpeedBackend(Backend):
    """DeepSpeed's shared-memory allreduce for CPUs: the kernel behind
    ``deepspeed.comm.inference_all_reduce`` (``torch.ops.deepspeed.inference_all_reduce_``),
    called directly. It sums one ordinary tensor in place, so it runs all_reduce only (the
    other operations show N/A), and only the dtypes its kernels run on this CPU: float32 with
    AVX2, bfloat16 and float16 with AVX-512 (``vector_kernel_level``, as DeepSpeed decides)."""

    name = "deepspeed"
    #: The kernel level each dtype needs (DeepSpeed's ``TorchBackend.inference_all_reduce``).
    LEVELS = {"float32": 1, "bfloat16": 2, "float16": 2}

    def __init__(self, rank: int, n: int) -> None:
        import torch
        import torch.distributed as dist

        # The kernel works over shared memory only when LOCAL_SIZE is the world size (all ranks
        # on this host, as symm's are), and names the memory after MASTER_ADDR and MASTER_PORT:
        # a key of this run where the launcher did not set them.
        os.environ["LOCAL_SIZE"] = str(n)
        if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
            key = torch.tensor([int.from_bytes(os.urandom(4), "little")], dtype=torch.int64)
            dist.broadcast(key, 0)
            os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "symm.perf", str(key.item())
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        from deepspeed.accelerator import get_accelerator  # type: ignore[import-not-found, unused-ignore]

        accel = get_accelerator()
        builder = accel.create_op_builder("ShareMemCommBuilder")
        if builder is None:
            raise SystemExit(
                f"symm.perf: --backends deepspeed: DeepSpeed's accelerator {accel.device_name()!r} has no "
                "shared-memory allreduce (DS_ACCELERATOR=cpu selects the CPU one)"
            )
        self.kernels = builder.load(verbose=False)  # built on first use (needs ninja and a C++ compiler)
        self.kernels.initialize(n, rank)  # returns once this rank has mapped every rank's segment
        self.level = int(self.kernels.vector_kernel_level())
        # DeepSpeed never unlinks its segments (about 66 MiB per rank in /dev/shm): once every
        # rank has mapped every segment, each rank removes its own name; the mappings stay.
        dist.barrier()
        addr, port = os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]
        try:
            os.unlink(f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_{addr}_{port}_{rank}")
        except FileNotFoundError:
            pass  # another naming (a DeepSpeed version that cleans up after itself)

    @classmethod
    def kernel_runs(cls, level: int, dtype: str) -> bool:
        """Whether DeepSpeed's kernel at ``level`` (``vector_kernel_level``) reduces ``dtype``."""
        return level >= cls.LEVELS.get(dtype, 1 << 30)

    def runs(self, dtype: str) -> bool:
        """Whether the kernel reduces ``dtype`` on this CPU."""
        return self.kernel_runs(self.level, dtype)

    def run(self, op: str, bufs: Dict[str, Any], rank: int, n: int) -> Optional[Callable[[], Any]]:
        import torch

        if op != "all_reduce" or not self.runs(str(DT).removeprefix("torch.")):
            return None
        return partial(torch.ops.deepspeed.inference_all_reduce_, bufs["recv"])


DT: Any = None  # the torch dtype of the run (set in each rank)


def bound_seconds(op: str, size: float, n: int, limits: str) -> float:
    """The memory-bandwidth bound of ``op`` (in place if in ``IN_PLACE``) on ``size`` bytes among
    ``n`` ranks at the memory rates ``limits`` (as ``measure_limits`` returns them): the model of
    ``symm_registry::host::membw``, which symm-bench reports too."""
    from symm import _symm

    return _symm.memory_bound(n, [(op, op in IN_PLACE, float(size))], limits)[0][0]


def measure_limits(rank: int, n: int) -> Optional[Tuple[str, str]]:
    """Rank 0's measurement of the memory rates (encoded, table), None on the other ranks; every
    rank calls it (the others wait meanwhile, idle)."""
    import torch.distributed as dist

    from symm import _symm

    limits = None
    if rank == 0:
        _, encoded, table = _symm.memory_bound(n, [])
        limits = (encoded, table)
    dist.barrier()
    return limits


def shapes(op: str, size: int, n: int, esize: int) -> Tuple[int, int, int]:
    """(count, send elements, receive elements) of one rank for ``size`` bytes."""
    if op in ("reduce_scatter", "all_gather", "alltoall"):
        c = max(size // (n * esize), 1)
        send = {"reduce_scatter": n * c, "all_gather": c, "alltoall": n * c}[op]
        recv = {"reduce_scatter": c, "all_gather": n * c, "alltoall": n * c}[op]
        return c, send, recv
    c = max(size // esize, 1)
    return c, (c if op == "sendrecv" else 0), c


def pattern(rank: int, numel: int) -> Any:
    import torch

    return ((torch.arange(numel) % 7) + rank + 1).to(DT)


def expected(op: str, rank: int, n: int, c: int) -> Any:
    import torch

    if op == "all_reduce":
        return sum(pattern(r, c).double() for r in range(n))
    if op == "reduce_scatter":
        return sum(pattern(r, n * c)[rank * c : (rank + 1) * c].double() for r in range(n))
    if op == "all_gather":
        return torch.cat([pattern(r, c) for r in range(n)]).double()
    if op == "alltoall":
        return torch.cat([pattern(r, n * c)[rank * c : (rank + 1) * c] for r in range(n)]).double()
    if op == "broadcast":
        return pattern(0, c).double()
    return pattern((rank - 1) % n, c).double()


def waited(call: partial) -> Callable[[], None]:
    """``call`` made with ``async_op=True``, its work then waited for (``--async-op``)."""
    fn, args = call.func, call.args

    def step() -> None:
        fn(*args, async_op=True).wait()

    return step


def measure(be: Backend, op: str, size: int, rank: int, n: int, args: argparse.Namespace) -> Tuple[float, int]:
    """(seconds per iteration on this rank, wrong elements)."""
    c, ns, nr = shapes(op, size, n, DT.itemsize)
    send = be.alloc(max(ns, 0)) if ns else None
    recv = be.alloc(nr)
    bufs = {"send": send if send is not None else recv, "recv": recv, "count": c}

    def fill() -> None:
        if send is not None:
            send.copy_(pattern(rank, ns))
        recv.copy_(pattern(rank, nr))

    fill()
    step = be.run(op, bufs, rank, n)
    if args.async_op and be.name in ("symm", "gloo") and type(step) is partial:
        step = waited(step)
    took, wrong = math.nan, 0
    if step is not None:  # None: not run by this backend (the same on every rank)
        for _ in range(args.warmup_iters):
            step()
        be.barrier()
        took = be.loop(step, args.iters) / args.iters
        if args.check:
            be.barrier()
            fill()
            be.barrier()
            step()
            want = expected(op, rank, n, c)
            wrong = int((recv[: want.numel()].double() != want).sum().item())
    be.barrier()
    if send is not None:
        be.release(send)
    be.release(recv)
    return took, wrong


def rank_main(rank: int, n: int, args: argparse.Namespace, mpi_comm: Any = None) -> None:
    import torch
    import torch.distributed as dist

    import symm

    global DT
    DT = getattr(torch, args.dtype)
    torch.set_num_threads(1)
    symm.init()
    # Before pinning: the measuring threads pin themselves to every CPU this process may use.
    limits = measure_limits(rank, n) if args.bound else None
    if args.pin:
        # After start-up, as symm-bench does: the core sizes its spin budget from the CPUs a
        # rank may use when it starts.
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    backends: List[Backend] = []
    if "symm" in args.backends:
        backends.append(SymmBackend(args.hosts))
    if "gloo" in args.backends:
        backends.append(GlooBackend())
    if "mpi" in args.backends and mpi_comm is not None and args.dtype not in ("bfloat16", "float16"):
        backends.append(MpiBackend(mpi_comm))
    deepspeed = DeepSpeedBackend(rank, n) if "deepspeed" in args.backends else None
    if deepspeed is not None:
        backends.append(deepspeed)
    names = [b.name for b in backends]
    ratios = [r for r, (a, b, _) in RATIOS.items() if a in names and b in names]
    out = sys.stdout
    if rank == 0:
        out.write(
            f"# symm.perf: {n} ranks"
            + (f" on {args.hosts} simulated hosts (symm: hierarchical, gloo between hosts)" if args.hosts > 1 else "")
            + f", dtype {args.dtype}, {args.iters} iterations after {args.warmup_iters} "
            f"warm-up, backends {', '.join(names)}, OMP_NUM_THREADS {os.environ.get('OMP_NUM_THREADS', 'unset')}"
            + (f", {args.runs} runs (backends taking turns)" if args.runs > 1 else "")
            + (", async_op=True (symm and gloo: each call's work waited for at once)" if args.async_op else "")
            + "\n# time: microseconds per iteration (slowest rank"
            + ("; best run" if args.runs > 1 else "")
            + "); busbw: GB/s (nccl-tests factors)"
            + "".join(f"; {r}: {RATIOS[r][2]}" for r in ratios)
            + ("; <ratio> med: median over the runs of the ratio within each run" if args.runs > 1 and ratios else "")
            + "\n"
        )
        if deepspeed is not None:
            out.write(
                "# deepspeed: DeepSpeed's shared-memory allreduce kernel (torch.ops.deepspeed.inference_all_reduce_, "
                f"in place, sum; kernel level {deepspeed.level}"
                + ("" if deepspeed.runs(args.dtype) else f": it does not reduce {args.dtype} on this CPU")
                + "); all_reduce only\n"
            )
        if limits is not None:
            out.write("".join(f"# {line}\n" for line in limits[1].splitlines()))
            out.write(
                "# bound(us): least time of the bytes the op must read and write at those rates (docs/performance.md, "
                '"The memory-bandwidth bound"); %bnd: bound / time\n'
            )
    records: List[Dict[str, Any]] = []
    total_wrong = 0
    for op in args.ops:
        if rank == 0:
            head = f"{'size':>10} {'count':>10}"
            head += "".join(f" {nm + '(us)':>11}" for nm in names)
            head += "".join(f" {nm + ' busbw':>11}" for nm in names)
            if limits is not None:
                head += f" {'bound(us)':>10}" + "".join(f" {nm + ' %bnd':>10}" for nm in names)
            head += "".join(f" {r:>9}" for r in ratios)
            if args.runs > 1:
                head += "".join(f" {r + ' med':>13}" for r in ratios)
            head += f" {'#wrong':>7}"
            out.write(f"\n# {op}  (busbw factor {bus_factor(op, n):.3g})\n#{head[1:]}\n")
            out.flush()
        for size in sizes(args):
            c, _, _ = shapes(op, size, n, DT.itemsize)
            runs, wrong = [], 0
            for _ in range(args.runs):
                times = []
                for be in backends:
                    t, w = measure(be, op, size, rank, n, args)
                    stat = torch.tensor([t, float(w)], dtype=torch.float64)
                    dist.all_reduce(stat[:1], op=dist.ReduceOp.MAX)
                    dist.all_reduce(stat[1:], op=dist.ReduceOp.SUM)
                    times.append(stat[0].item())
                    wrong += int(stat[1].item())
                runs.append(times)
            times = best_times(runs)
            total_wrong += wrong
            if rank == 0:
                moved = c * DT.itemsize * (n if op in ("reduce_scatter", "all_gather", "alltoall") else 1)
                bws = [moved / t / 1e9 * bus_factor(op, n) for t in times]
                by = dict(zip(names, times))
                line = f"{moved:>10} {c:>10}"
                line += "".join(f" {_num(t * 1e6, '.2f'):>11}" for t in times)
                line += "".join(f" {_num(b, '.4g'):>11}" for b in bws)
                bound = bound_seconds(op, moved, n, limits[0]) if limits is not None else None
                if bound is not None:
                    line += f" {bound * 1e6:>10.3f}" + "".join(f" {_num(100 * bound / t, '.1f'):>10}" for t in times)
                line += "".join(f" {_num(by[RATIOS[r][0]] / by[RATIOS[r][1]], '.2f'):>9}" for r in ratios)
                if args.runs > 1:
                    medians = [
                        paired_median(runs, names.index(RATIOS[r][0]), names.index(RATIOS[r][1])) for r in ratios
                    ]
                    line += "".join(f" {_num(m, '.2f'):>13}" for m in medians)
                line += f" {wrong:>7}"
                out.write(line + "\n")
                out.flush()
                clean = {k: (None if math.isnan(t) else t) for k, t in by.items()}
                records.append({"op": op, "size": moved, "times": clean, "bound": bound})
    if rank == 0:
        out.write(f"\n# wrong elements in total: {total_wrong}\n")
        out.flush()
        saved = {
            "ranks": n,
            "dtype": args.dtype,
            "backends": names,
            "async_op": args.async_op,
            "in_place": [op for op in args.ops if op in IN_PLACE],
            "limits": limits[0] if limits else None,
            "results": records,
        }
        if args.json:
            with open(args.json, "w") as f:
                json.dump(saved, f, indent=1)
        if args.plot:
            plot(saved, args.plot)
    dist.barrier()
    if total_wrong:
        raise SystemExit(1)


def _pyplot() -> Any:
    """matplotlib's pyplot on a backend without a display, or a clear error."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("symm.perf: --plot needs matplotlib: pip install 'symm[plot]' (or matplotlib)") from None
    return plt


def _size_label(size: float, _pos: Any = None) -> str:
    for shift, unit in ((30, "G"), (20, "M"), (10, "K")):
        if size >= 1 << shift:
            return f"{size / (1 << shift):g}{unit}"
    return f"{size:g}"


def plot(saved: Dict[str, Any], path: str) -> None:
    """Draws busbw against size from a run as ``--json`` saves it: one panel per operation, a
    line per backend and the busbw the memory-bandwidth bound allows, into ``path``."""
    plt = _pyplot()
    from matplotlib.ticker import FuncFormatter

    n, results = saved["ranks"], saved["results"]
    ops = [op for op in OPS if any(r["op"] == op for r in results)]
    if not ops:
        raise SystemExit(f"symm.perf: --plot {path}: the run has no results to draw")
    cols = min(3, len(ops))
    rows = -(-len(ops) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.3 * cols, 3.2 * rows), squeeze=False)
    for ax, op in zip(axes.flat, ops):
        recs = [r for r in results if r["op"] == op and r["size"] > 0]
        factor = bus_factor(op, n)
        for be in saved["backends"]:
            pts = [(r["size"], r["size"] / r["times"][be] / 1e9 * factor) for r in recs if r["times"].get(be)]
            if pts:
                ax.plot(*zip(*pts), marker="o", markersize=2.5, linewidth=1.2, label=be)
        pts = [(r["size"], r["size"] / r["bound"] / 1e9 * factor) for r in recs if r.get("bound")]
        if pts:
            ax.plot(*zip(*pts), "k--", linewidth=1, label="memory bound")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(_size_label))
        ax.set_title(op + (" (in place)" if op in saved.get("in_place", ()) else ""), fontsize=10)
        ax.set_xlabel("size (bytes)", fontsize=8)
        ax.set_ylabel("busbw (GB/s)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(ops) :]:
        ax.set_visible(False)
    fig.suptitle(f"python -m symm.perf: {n} ranks, {saved['dtype']}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _num(value: float, fmt: str) -> str:
    """``value`` formatted, or ``N/A`` for an operation the backend does not run."""
    return "N/A" if math.isnan(value) else format(value, fmt)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _in_process_group(n: int, args: argparse.Namespace, mpi_comm: Any = None, **init: Any) -> None:
    """Joins the gloo process group of ``n`` ranks (``init``: the rest of what
    ``init_process_group`` takes), runs this rank, and leaves the group."""
    import torch.distributed as dist

    dist.init_process_group("gloo", **init)
    try:
        if args.ddp:
            from .perf_ddp import ddp_main

            ddp_main(dist.get_rank(), n, args)
        else:
            rank_main(dist.get_rank(), n, args, mpi_comm)
    finally:
        dist.destroy_process_group()


def _spawned(rank: int, n: int, port: int, args: argparse.Namespace) -> None:
    if args.hosts > 1:
        os.environ["SYMM_HOST_ID"] = f"perf-host-{rank * args.hosts // n}"
    init = f"tcp://127.0.0.1:{port}"
    _in_process_group(n, args, init_method=init, rank=rank, world_size=n, timeout=datetime.timedelta(seconds=120))


def _mpi_world() -> Optional[Any]:
    """MPI.COMM_WORLD when an MPI launcher started this process with several ranks and mpi4py
    imports; otherwise None."""
    launched = any(k in os.environ for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"))
    if not launched:
        return None
    try:
        from mpi4py import MPI  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    comm = MPI.COMM_WORLD
    return comm if comm.Get_size() > 1 else None


def default_heap(args: argparse.Namespace, n: int) -> None:
    """Sets SYMMETRIC_MEMORY_HEAP_SIZE, unless given, to what the largest size needs: two
    buffers of the largest size, the world's collective workspace (staging area, and per member
    a mailbox of 64 chunks and a ring of small-broadcast slots, 516 KiB at most), and slack."""
    if "SYMMETRIC_MEMORY_HEAP_SIZE" in os.environ:
        return
    work = parse_size(os.environ.get("SYMM_COLL_WORKSPACE", "16M"))
    chunk = parse_size(os.environ.get("SYMM_P2P_CHUNK", "16K"))
    per_member = 64 * chunk + 64 * 8256 + (16 << 10)
    need = 2 * args.maxbytes + 2 * max(args.maxbytes // n, 1) + work + n * per_member + (16 << 20)
    os.environ["SYMMETRIC_MEMORY_HEAP_SIZE"] = str(((need + (1 << 20) - 1) >> 20) << 20)


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parser().parse_args(argv)
    validate(args)
    if args.saved:
        with open(args.saved) as f:
            plot(json.load(f), args.plot)
        return
    # One rank per core: torch's OpenMP workers, spinning after each parallel region, take the
    # cores the ranks need (small messages of every backend measured 2-4x slower). Set before
    # torch is first imported (here or in the ranks spawned below); an explicit setting wins.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mpi = _mpi_world()
    if mpi is not None and "mpi" in args.backends and importlib.util.find_spec("numpy") is None:
        raise SystemExit(
            "symm.perf: --backends mpi: numpy not installed (pip install numpy: mpi4py reads the tensors through it), "
            "or leave mpi out of --backends"
        )
    if mpi is not None:
        n, rank = mpi.Get_size(), mpi.Get_rank()
        default_heap(args, n)
        port = mpi.bcast(free_port() if rank == 0 else None, root=0)
        _in_process_group(n, args, mpi, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    elif "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        n = int(os.environ["WORLD_SIZE"])
        default_heap(args, n)
        _in_process_group(n, args)
    else:
        import torch.multiprocessing as mp

        default_heap(args, args.ranks)
        mp.spawn(_spawned, args=(args.ranks, free_port(), args), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
