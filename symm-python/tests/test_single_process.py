"""Single-process tests: the exception family, the store adapter, the package surface."""

import ast
import datetime
import math
import pathlib
import subprocess
import sys
import threading
import time

import pytest

import symm
from symm import _symm

CODES = {
    "InvalidArgument": "SYMM_E_INVALID_ARGUMENT",
    "GroupError": "SYMM_E_GROUP",
    "HeapError": "SYMM_E_HEAP",
    "HeapExhausted": "SYMM_E_HEAP_EXHAUSTED",
    "Timeout": "SYMM_E_TIMEOUT",
    "PeerLost": "SYMM_E_PEER_LOST",
    "Mismatch": "SYMM_E_MISMATCH",
    "PeerRejected": "SYMM_E_PEER_REJECTED",
    "BootstrapError": "SYMM_E_BOOTSTRAP",
    "Unsupported": "SYMM_E_UNSUPPORTED",
    "SystemFailure": "SYMM_E_SYSTEM",
    "DeviceError": "SYMM_E_DEVICE",
}


def test_one_exception_family_with_stable_codes():
    for name, code in CODES.items():
        cls = getattr(symm, name)
        assert issubclass(cls, symm.SymmError), name
        assert cls.code == code, name
        assert cls.__module__ == "symm" and cls.__doc__, name
    # Also what the callers of HyperParallel and PyTorch catch: ValueError for bad arguments and
    # ranks, RuntimeError for timeouts and failures (docs/errors.md, "Python classes").
    for name in ("InvalidArgument", "GroupError"):
        cls = getattr(symm, name)
        assert issubclass(cls, ValueError) and not issubclass(cls, RuntimeError), name
    for name in CODES:
        if name not in ("InvalidArgument", "GroupError"):
            assert issubclass(getattr(symm, name), RuntimeError), name
    assert issubclass(symm.Timeout, TimeoutError)
    assert issubclass(symm.SystemFailure, OSError)
    assert issubclass(symm.Unsupported, NotImplementedError)
    assert issubclass(symm.HeapExhausted, symm.HeapError)
    assert issubclass(symm.PeerExited, symm.PeerLost)
    assert symm.SymmError.code is None and issubclass(symm.SymmError, Exception)
    assert not issubclass(symm.SymmError, (ValueError, RuntimeError))


class DictStore:
    """A c10d-style store in a dict; records the timeouts it is given."""

    def __init__(self):
        self.data, self.waits = {}, []
        self.cond = threading.Condition()

    def set(self, key, value):
        with self.cond:
            self.data[key] = bytes(value)
            self.cond.notify_all()

    def wait(self, keys, timeout):
        self.waits.append(timeout)
        deadline = time.monotonic() + timeout.total_seconds()
        with self.cond:
            while not all(k in self.data for k in keys):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError("Wait timeout")  # what c10d stores raise
                self.cond.wait(left)

    def get(self, key):
        return self.data[key]


def test_native_init_through_a_python_store(monkeypatch):
    monkeypatch.setenv("SYMMETRIC_MEMORY_HEAP_SIZE", "1M")
    monkeypatch.setenv("SYMMETRIC_MEMORY_TIMEOUT", "7")
    store = DictStore()
    comm = _symm.init(0, 1, store, prefix="t1")
    assert (comm.rank, comm.world_size, comm.heap_size, comm.backend) == (0, 1, 1 << 20, "sim")
    assert comm.default_timeout == 7.0 and comm.world.ranks == [0]
    # Every wait is bounded by the timeout; the start-up waits in slices (of 100 ms) to look
    # for a peer's failure record in between.
    bound = datetime.timedelta(seconds=7)
    assert store.waits and all(datetime.timedelta(0) < w <= bound for w in store.waits), store.waits
    assert all(k.startswith("t1/") for k in store.data), list(store.data)


def test_the_backend_is_chosen_by_name_and_the_cpu_one_takes_no_stream(monkeypatch):
    monkeypatch.setenv("SYMMETRIC_MEMORY_HEAP_SIZE", "1M")
    monkeypatch.setenv("SYMMETRIC_MEMORY_TIMEOUT", "5")
    assert _symm.BACKENDS[0] == "sim"
    comm = _symm.init(0, 1, DictStore(), prefix="b1", backend="sim")
    assert (comm.backend, comm.device) == ("sim", "cpu")
    # Streams are a device communicator's (the caller's current stream): the CPU refuses one.
    with pytest.raises(symm.InvalidArgument, match="stream = 0x10: the CPU backend runs its calls on its own"):
        comm.barrier(comm.world, stream=0x10)
    block = comm.alloc(comm.world, 4, "float32")
    assert block.device == "cpu" and len(memoryview(block)) == 16
    with pytest.raises(symm.BootstrapError) as e:
        _symm.init(0, 1, DictStore(), prefix="b2", backend="nope")
    assert "SYMM_BACKEND" in str(e.value) and "nope" in str(e.value) and "known: sim, ascend" in str(e.value)
    if "ascend" not in _symm.BACKENDS:
        with pytest.raises(symm.BootstrapError, match="backend ascend is not compiled in"):
            _symm.init(0, 1, DictStore(), prefix="b3", backend="ascend")


def test_store_waits_are_bounded_and_reported(monkeypatch):
    monkeypatch.setenv("SYMMETRIC_MEMORY_TIMEOUT", "0.5")
    t0 = time.monotonic()
    with pytest.raises(symm.BootstrapError) as e:
        _symm.init(0, 2, DictStore(), prefix="t2")  # rank 1 never comes
    assert time.monotonic() - t0 < 5
    assert "rank 0" in str(e.value) and "Wait timeout" in str(e.value) and e.value.rank == 0, e.value
    assert e.value.code == "SYMM_E_BOOTSTRAP"


def test_bad_init_arguments_name_the_argument(monkeypatch):
    monkeypatch.setenv("SYMMETRIC_MEMORY_TIMEOUT", "1")
    with pytest.raises(symm.InvalidArgument, match=r"rank = 2: must lie in \[0, world_size = 2\)"):
        _symm.init(2, 2, DictStore())
    with pytest.raises(symm.InvalidArgument, match="world_size = 0"):
        _symm.init(0, 0, DictStore())
    with pytest.raises(symm.InvalidArgument, match=r"store = .*has no set\(\) method"):
        _symm.init(0, 1, object())
    monkeypatch.setenv("SYMMETRIC_MEMORY_HEAP_SIZE", "lots")
    with pytest.raises(symm.BootstrapError, match="SYMMETRIC_MEMORY_HEAP_SIZE"):
        _symm.init(0, 1, DictStore())


def test_using_symm_before_torch_distributed_is_a_bootstrap_error():
    # In a fresh interpreter: this process may already have started symm in another test.
    code = (
        "import torch, symm\n"
        "try:\n"
        "    symm.empty(4, torch.float32)\n"
        "except symm.BootstrapError as e:\n"
        "    assert 'init_process_group' in str(e), e\n"
        "    print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stdout + out.stderr


def test_stubs_cover_the_public_api():
    pkg = pathlib.Path(symm.__file__).parent
    assert (pkg / "py.typed").exists()
    stub = ast.parse((pkg / "__init__.pyi").read_text())
    declared = set()
    for node in ast.walk(stub):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            declared.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            declared.add(node.target.id)
        elif isinstance(node, ast.Assign):
            declared.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom):
            # `from ._symm import X as X` is an explicit re-export in a stub
            declared.update(a.name for a in node.names if a.asname == a.name)
    missing = sorted(set(symm.__all__) - declared)
    assert not missing, f"names of symm.__all__ without a stub: {missing}"
    native = ast.parse((pkg / "_symm.pyi").read_text())
    names = {n.name for n in ast.walk(native) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    for cls in ("Communicator", "Group", "HeapBlock"):
        assert cls in names
        for attr in dir(getattr(_symm, cls)):
            if not attr.startswith("_"):
                assert attr in names, f"_symm.{cls}.{attr} has no stub"


def test_unknown_platform_is_unsupported(monkeypatch):
    code = (
        "import os, symm\n"
        "os.environ['SYMM_PLATFORM'] = 'paddle'\n"
        "from symm.platform import get_platform\n"
        "try:\n"
        "    get_platform()\n"
        "except symm.Unsupported as e:\n"
        "    assert 'paddle' in str(e) and 'torch' in str(e), e\n"
        "    print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stdout + out.stderr


def test_framework_modules_load_on_first_use_and_cover_every_collective():
    code = (
        "import sys, symm\n"
        "assert 'symm.functional' not in sys.modules and 'symm.autograd' not in sys.modules\n"
        "F = symm.functional\n"
        "assert sorted(F.__all__) == sorted(['all_gather', 'reduce_scatter', 'all_reduce', 'all_to_all',"
        " 'broadcast', 'send', 'recv', 'sendrecv'])\n"
        "import torch\n"
        "for name in symm.autograd.__all__:\n"
        "    assert issubclass(getattr(symm.autograd, name), torch.autograd.Function), name\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stdout + out.stderr


def test_perf_options_are_checked_before_any_rank_starts():
    from symm import perf

    for argv, needle in [
        (["-o", "all_reduce,bogus"], "bogus"),
        (["-f", "1"], "step factor"),
        (["-g", "1"], "at least 2 ranks"),
        (["-b", "1M", "-e", "1K"], "larger than"),
        (["-r", "0"], "at least 1 run"),
    ]:
        with pytest.raises(SystemExit, match=needle):
            perf.main(argv)
    args = perf.parser().parse_args(["-b", "8", "-e", "128", "-f", "2"])
    assert perf.sizes(args) == [8, 16, 32, 64, 128]
    assert perf.parse_size("64K") == 65536 and perf.parse_size("16M") == 16 << 20
    assert [perf.bus_factor(op, 4) for op in perf.OPS] == [1.5, 0.75, 0.75, 0.75, 1.0, 1.0]
    # per-rank element counts: the total array for reduce_scatter / all_gather / alltoall
    assert perf.shapes("all_gather", 4096, 4, 4) == (256, 256, 1024)
    assert perf.shapes("reduce_scatter", 4096, 4, 4) == (256, 1024, 256)
    assert perf.shapes("all_reduce", 4096, 4, 4) == (1024, 0, 1024)


def test_perf_loops_call_the_function_itself_with_the_partials_arguments():
    from functools import partial

    from symm import perf

    calls = []

    def record(*args, **kwargs):
        calls.append((args, kwargs))

    # Every arity the loop spells out, then what it runs as given: more arguments, keywords,
    # a plain callable.
    for args in [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), (1, 2, 3, 4, 5), (1, 2, 3, 4, 5, 6)]:
        calls.clear()
        assert perf.call_loop(partial(record, *args), 3) >= 0
        assert calls == [(args, {})] * 3, args
    class Wrapped(partial):
        def __call__(self, *args, **kwargs):
            return record("wrapped", *self.args)

    for step, want in [
        (partial(record, *range(7)), (tuple(range(7)), {})),
        (partial(record, 1, root=0), ((1,), {"root": 0})),
        (lambda: record(9), ((9,), {})),
        (Wrapped(record, 2), (("wrapped", 2), {})),
    ]:
        calls.clear()
        perf.call_loop(step, 2)
        assert calls == [want] * 2


def test_perf_runs_keep_each_backends_best_time_and_the_median_of_the_paired_ratios():
    from symm import perf

    nan = math.nan
    # runs[r][b]: backend 1 hit by noise in run 0, backend 2 runs nothing.
    runs = [[2.0, 9.0, nan], [3.0, 2.0, nan], [1.0, 1.5, nan]]
    best = perf.best_times(runs)
    assert best[:2] == [1.0, 1.5] and math.isnan(best[2])
    # ratios of backend 0 to 1 within each run: 2/9, 1.5, 2/3 -> median 2/3
    assert perf.paired_median(runs, 0, 1) == 2.0 / 3.0
    assert perf.paired_median(runs[:2], 0, 1) == (2.0 / 9.0 + 1.5) / 2  # even count: the mean of the middle two
    assert math.isnan(perf.paired_median(runs, 0, 2))
    assert perf.parser().parse_args([]).runs == 1
