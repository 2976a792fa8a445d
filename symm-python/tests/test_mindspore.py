"""symm on MindSpore (``symm.platform.mindspore``): run by ``scripts/mindspore-tests.sh`` in an
environment with ``mindspore==2.10.0`` and ``numpy<2`` and no PyTorch; skipped elsewhere.

The multi-rank jobs run the scenarios of ``scenarios_platform.py`` (the ones
``test_platforms.py`` runs on PyTorch) in MindSpore dynamic clusters and under ``msrun``; MindSpore
moves no data in them (its CPU collectives lack most operations): it starts the job, names the
groups and carries the start-up's port and secret.
"""

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
from harness import DEFAULT_ENV, HERE, check_all_passed, free_port, run_ms_ranks

ms = pytest.importorskip("mindspore")
np = pytest.importorskip("numpy")


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter (a single-process check: no cluster)."""
    e = {**os.environ, **DEFAULT_ENV, "GLOG_v": "3", **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True, text=True, timeout=120, cwd=HERE
    )


def test_environment_has_no_torch():
    # The MindSpore stage proves that symm needs no PyTorch.
    assert importlib.util.find_spec("torch") is None


def test_platform_is_found_without_configuration():
    out = run_python(
        """
        import sys, symm, symm.platform as p
        from mindspore import communication
        assert "torch" not in sys.modules
        assert p._imported() == "torch"            # nothing started yet: the default
        communication.GlobalComm.INITED = True     # as after init(): MindSpore's runtime is up
        assert p._imported() == "mindspore"
        assert symm.is_shmem_available()
        print("ok")
        """
    )
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout + out.stderr


def test_init_before_mindspore_communication_names_what_to_do():
    out = run_python(
        """
        import symm
        try:
            symm.init()
        except symm.BootstrapError as e:
            print("raised:", e)
        """,
        SYMM_PLATFORM="mindspore",
    )
    assert "mindspore.communication.init()" in out.stdout and "msrun" in out.stdout, out.stdout + out.stderr


def test_tensors_are_described_and_wrapped_without_copies():
    from symm.platform.mindspore import MindSporePlatform

    p = MindSporePlatform()
    t = ms.Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    ptr, numel, dtype, contiguous, device, shown, storage = p.describe(t)
    assert (numel, dtype, contiguous, device, shown) == (12, "float32", True, "cpu", None)
    assert ptr == t.data_ptr() and storage == (ptr, 48)
    row = t[1]  # a view: its own address, its own bytes
    assert p.describe(row)[0] == ptr + 16 and p.describe(row)[6] == (ptr + 16, 16)
    d = p.describe(t.T)
    assert d[3] is False and "strides" in d[5] and d[0] == 0  # refused by the caller, never read
    assert p.describe(ms.Parameter(ms.Tensor(np.ones(2, np.float32)), name="w"))[1:3] == (2, "float32")
    assert p.describe(np.ones(2)) is None and p.describe([1]) is None
    assert p.scalar(ms.Tensor(7, ms.int64)) == 7 and isinstance(p.scalar(ms.Tensor(7.5)), ms.Tensor)

    class Block(bytearray):
        """Stands in for a native heap block: writable bytes with a dtype name."""

        dtype = "bfloat16"

        @property
        def nbytes(self):
            return len(self)

    for name in ("float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool",
                 "float8_e4m3fn", "float8_e5m2"):
        dt = getattr(ms, name if name != "bool" else "bool_")
        assert p.dtype_name(dt) == name and p.itemsize(dt) == dt.itemsize
        block = Block(6 * dt.itemsize)
        block.dtype = name
        w = p.wrap(block, (2, 3), dt)
        assert w.dtype == dt and tuple(w.shape) == (2, 3)
        assert w.data_ptr() == np.frombuffer(block, np.uint8).ctypes.data, name  # zero-copy
    block = Block(8)
    block.dtype = "float32"
    w = p.wrap(block, (2,), ms.float32)
    np.frombuffer(block, np.float32)[:] = [1.5, -2.0]  # the block's memory is the tensor's
    assert w.asnumpy().tolist() == [1.5, -2.0]
    p.detach_storage(w)
    assert p.is_freed(w) and p.describe(w) is None and w.shape == (0,)


def test_store_has_wait_and_check():
    from datetime import timedelta

    from mindspore.mint.distributed import TCPStore
    from symm.platform.mindspore import _PrefixStore

    base = TCPStore("127.0.0.1", free_port(), 1, is_master=True, timeout=timedelta(seconds=5))
    s = _PrefixStore(base, "p/")
    assert not s.check(["k"])
    with pytest.raises(TimeoutError, match="not set within"):
        s.wait(["k"], timedelta(seconds=0.2))
    s.set("k", b"v")
    assert s.check(["k"]) and s.get("k") == b"v"
    s.wait(["k"], timedelta(seconds=1))
    assert not _PrefixStore(base, "q/").check(["k"])  # prefixes keep keys apart


@pytest.mark.parametrize("world", [2, 4])
def test_platform_scenarios_on_mindspore(tmp_path, world):
    from scenarios_platform import job

    check_all_passed(run_ms_ranks(job(world), world, tmp_path, timeout=240))


def test_under_msrun(tmp_path):
    msrun = os.path.join(os.path.dirname(sys.executable), "msrun")
    cmd = [msrun, "--worker_num=2", "--local_worker_num=2", "--master_addr=127.0.0.1", f"--master_port={free_port()}",
           f"--log_dir={tmp_path / 'logs'}", "--join=True", "--cluster_time_out=90",
           str(HERE / "ms_worker.py"), "scenarios_platform.primitives"]
    # msrun starts its workers with the `python` on PATH: this interpreter's.
    path = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    env = {**os.environ, **DEFAULT_ENV, "GLOG_v": "3", "PATH": path}
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    logs = {f: (tmp_path / "logs" / f).read_text() for f in ("worker_0.log", "worker_1.log")}
    assert out.returncode == 0, out.stdout[-3000:] + "\n".join(v[-3000:] for v in logs.values())
    for r, f in enumerate(sorted(logs)):
        assert f"SYMM-TEST-PASS rank {r}" in logs[f], logs[f][-3000:]
