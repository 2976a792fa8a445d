"""The fast paths of ``symm.shmem_allreduce`` and the other collectives with one (src/ops.rs), and
``python -m symm.perf --native``."""

import importlib.machinery
import importlib.util
import inspect

import pytest

import symm
from harness import check_all_passed, run_perf, run_ranks
from symm import _symm


@pytest.mark.parametrize("reader", ["handle", "shim", "descriptors"])
def test_fast_path_results_fallbacks_errors_profiler_on_3_ranks(tmp_path, reader):
    # 3 ranks: a sub-group leaves one rank out (non-member errors on both paths). Tensors are
    # read through torch's C shim on the at::Tensor inside the tensor object, through the C
    # shim on the address `_cdata` gives (the fallback where that offset is not found), or
    # through the descriptors (a torch without the shim).
    env = {"SYMMETRIC_MEMORY_TIMEOUT": "5", "SYMM_TEST_FAST_READER": reader}
    check_all_passed(run_ranks("scenarios_fast.fast_path", 3, tmp_path, env=env))


def test_fast_paths_of_reduce_scatter_allgather_broadcast_send_recv_on_3_ranks(tmp_path):
    env = {"SYMMETRIC_MEMORY_TIMEOUT": "5", "SYMM_TEST_FAST_READER": "handle"}
    check_all_passed(run_ranks("scenarios_fast.fast_path_split_ops", 3, tmp_path, env=env))


def test_fast_path_can_be_turned_off(tmp_path):
    check_all_passed(run_ranks("scenarios_fast.full_path_only", 2, tmp_path, env={"SYMM_FAST_PATH": "0"}))


def test_public_allreduce_is_native_with_the_documented_signature():
    f = symm.shmem_allreduce
    assert f is _symm.shmem_allreduce and f.__name__ == "shmem_allreduce"
    assert str(inspect.signature(f)) == "(tensor, op='sum', group=None, low_precision_dtype=None)"
    assert "Collective over ``group``" in f.__doc__ and "Raises:" in f.__doc__
    with pytest.raises(ValueError, match="no fast path"):
        _symm.set_full_path("barrier", print)


def test_perf_native_column_times_the_rust_api_in_the_same_run(tmp_path):
    text = run_perf(
        ["-b", "8", "-e", "512", "-f", "8", "-n", "200", "-w", "20", "-g", "2", "-o", "all_reduce,broadcast"]
        + ["--backends", "symm", "--native", "1", "-r", "3"],
        tmp_path,
    )
    assert "symm(us)" in text and "rust(us)" in text and "py/rust med" in text and "gloo" not in text, text
    assert "3 runs (backends taking turns)" in text and "best run" in text, text
    rows = {}
    for line in text.splitlines():
        if line.startswith("# all_reduce") or line.startswith("# broadcast"):
            op = line.split()[1]
        elif line and not line.startswith("#"):
            rows.setdefault(op, []).append(line.split())
    assert len(rows["all_reduce"]) == 3 and len(rows["broadcast"]) == 3, text
    for row in rows["all_reduce"]:
        # size, count, symm, rust, 2 busbw, bound, 2 %bound, py/rust, py/rust med, #wrong
        assert len(row) == 12 and row[-1] == "0", row
        symm_us, rust_us, ratio, median = float(row[2]), float(row[3]), float(row[9]), float(row[10])
        assert 0 < rust_us and 0 < symm_us and 0 < median, row
        # The ratio is computed before the times are printed to two decimals: it lies between
        # the ratios of the printed times moved by half a unit in the last place (and itself
        # rounded to two decimals).
        half = 0.005
        low, high = (symm_us - half) / (rust_us + half), (symm_us + half) / max(rust_us - half, 1e-9)
        assert low - half <= ratio <= high + half, row
    for row in rows["broadcast"]:
        assert row[3] == "N/A" and row[5] == "N/A" and row[8] == "N/A" and row[9:11] == ["N/A"] * 2, row
        assert row[-1] == "0", row


def test_perf_backend_and_native_options_are_checked(monkeypatch):
    from symm import perf

    for argv, needle in [
        (["--backends", "symm,nccl"], "nccl"),
        (["--native", "2"], "expected 0 or 1"),
        (["--native", "1", "--backends", "gloo"], "needs the symm backend"),
        (["--pin", "3"], "expected 0 or 1"),
    ]:
        with pytest.raises(SystemExit, match=needle):
            perf.main(argv)
    # deepspeed is asked for by name, and refused before any rank starts when it is missing.
    assert "deepspeed" not in perf.parser().parse_args([]).backends
    # Which of the two is installed here must not matter: the check is asked about a machine
    # where exactly the named ones are absent and the others present.
    real_find_spec = importlib.util.find_spec
    for absent, message in [
        ({"deepspeed"}, "deepspeed not installed"),
        ({"ninja"}, "ninja not installed"),
        ({"deepspeed", "ninja"}, "deepspeed and ninja not installed"),
    ]:

        def find_spec(name, package=None, absent=absent):
            if name in ("deepspeed", "ninja"):
                return None if name in absent else importlib.machinery.ModuleSpec(name, None)
            return real_find_spec(name, package)

        monkeypatch.setattr(importlib.util, "find_spec", find_spec)
        with pytest.raises(SystemExit, match=f"--backends deepspeed: {message}"):
            perf.main(["--backends", "symm,deepspeed"])
    # Its kernels: float32 from AVX2 (level 1), bfloat16 and float16 from AVX-512 (level 2).
    runs = perf.DeepSpeedBackend.kernel_runs
    assert runs(1, "float32") and runs(2, "bfloat16") and runs(2, "float16")
    assert not runs(0, "float32") and not runs(1, "bfloat16") and not runs(1, "float16")
    assert not any(runs(2, d) for d in ("float64", "int32", "int64"))
