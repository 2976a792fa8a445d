"""Collectives, autograd, interop with torch.distributed and the perf entry point, on real ranks."""

import importlib.util
import json
import time

import pytest

from harness import check_all_passed, run_perf, run_ranks


def test_collectives_on_the_world_and_on_groups_in_any_order_4_ranks(tmp_path):
    check_all_passed(run_ranks("scenarios_coll.collectives", 4, tmp_path, store="tcp", timeout=150))


def test_collectives_bad_input_right_class_on_every_rank_and_nobody_hangs(tmp_path):
    t0 = time.monotonic()
    check_all_passed(run_ranks("scenarios_coll.coll_bad_input", 4, tmp_path, env={"SYMMETRIC_MEMORY_TIMEOUT": "3"}))
    assert time.monotonic() - t0 < 90


@pytest.mark.parametrize("world", [2, 3, 4])
def test_autograd_gradcheck_conventions_and_gloo_reference(tmp_path, world):
    check_all_passed(run_ranks("scenarios_autograd.autograd", world, tmp_path, timeout=150))


def test_training_on_a_2x2_mesh_symm_in_dp_gloo_in_tp_matches_all_gloo(tmp_path):
    results = run_ranks("scenarios_autograd.interop_mesh", 4, tmp_path, store="tcp", timeout=120)
    check_all_passed(results)
    for r in results:
        assert "max |symm - gloo|" in r.output, r.output[-2000:]


def test_perf_entry_point_runs_every_op_through_symm_and_gloo_and_checks_results(tmp_path):
    from symm import perf

    # a small run: every operation, three sizes, 2 spawned ranks; the default run is larger
    text = run_perf(
        ["-b", "1K", "-e", "256K", "-f", "16", "-n", "3", "-w", "1", "-g", "2", "--json", str(tmp_path / "run.json")],
        tmp_path,
    )
    for op in ("all_reduce", "reduce_scatter", "all_gather", "alltoall", "sendrecv", "broadcast"):
        assert f"# {op}" in text, text
    rows = [line.split() for line in text.splitlines() if line and not line.startswith("#")]
    assert len(rows) == 6 * 3, text
    for row in rows:
        # size, count, 2 times, 2 busbw, bound, 2 %bound, ratio, #wrong
        assert len(row) == 11 and row[-1] == "0", row
        symm_us, bound_us, symm_pct = float(row[2]), float(row[6]), float(row[7])
        # %bnd = bound / time, from the unrounded values: the printed time and bound are rounded
        # to 0.01 and 0.001 us and the percentage to 0.1, so it lies within what those allow.
        lowest = 100 * (bound_us - 0.0005) / (symm_us + 0.005) - 0.05
        highest = 100 * (bound_us + 0.0005) / max(symm_us - 0.005, 1e-9) + 0.05
        assert bound_us > 0 and lowest <= symm_pct <= highest, (row, lowest, highest)
    assert "symm(us)" in text and "gloo(us)" in text and "wrong elements in total: 0" in text, text
    assert "# memory rates" in text and "bound(us)" in text and "symm %bnd" in text, text
    saved = json.loads((tmp_path / "run.json").read_text())
    assert saved["ranks"] == 2 and saved["backends"] == ["symm", "gloo"] and len(saved["results"]) == 6 * 3, saved
    for r in saved["results"]:
        assert r["bound"] > 0 and r["times"]["symm"] > 0 and r["times"]["gloo"] > 0, r
    # the saved bound is the model's at the saved rates
    r = saved["results"][0]
    assert r["bound"] == perf.bound_seconds(r["op"], r["size"], 2, saved["limits"]), r


@pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None or importlib.util.find_spec("ninja") is None,
    reason="the deepspeed column needs deepspeed and ninja installed (pip install deepspeed ninja)",
)
def test_perf_deepspeed_column_times_its_allreduce_and_checks_it(tmp_path):
    # The first run builds DeepSpeed's kernel (a C++ compile, cached afterwards).
    text = run_perf(
        ["-b", "1K", "-e", "64K", "-f", "64", "-n", "3", "-w", "1", "-g", "2", "-o", "all_reduce,broadcast"]
        + ["--backends", "symm,deepspeed", "--bound", "0", "-r", "2"],
        tmp_path, timeout=600,
    )
    assert "# deepspeed: DeepSpeed's shared-memory allreduce kernel" in text, text
    assert "deepspeed(us)" in text and "symm/deepspeed" in text and "wrong elements in total: 0" in text, text
    rows: dict = {"all_reduce": [], "broadcast": []}
    op = None
    for line in text.splitlines():
        if line.startswith("# all_reduce") or line.startswith("# broadcast"):
            op = line.split()[1]
        elif op and line and not line.startswith("#"):
            rows[op].append(line.split())
    # size, count, 2 times, 2 busbw, ratio, ratio med, #wrong
    assert [len(r) for r in rows["all_reduce"] + rows["broadcast"]] == [9] * 4, text
    for row in rows["all_reduce"]:
        assert float(row[3]) > 0 and float(row[6]) > 0 and row[-1] == "0", row
    for row in rows["broadcast"]:
        assert row[3] == "N/A" and row[6] == "N/A" and row[-1] == "0", row


def test_perf_bound_follows_the_traffic_model_and_can_be_left_out(tmp_path):
    from symm import perf

    from symm import _symm

    # The limits of symm-sim's test `bound_takes_the_busiest_rank_and_the_machine_at_their_levels`
    # (membw.rs), which expects the same figures from the same function: 1 MiB and 64 MiB levels,
    # read and write rates of one thread : of two.
    limits = (
        "2;1;1048576:100000000000,50000000000:200000000000,100000000000;"
        "67108864:20000000000,10000000000:30000000000,15000000000"
    )
    mib = float(1 << 20)
    # all_reduce runs in place here: 16 MiB on 2 ranks, one rank's 16 MiB written at 50 GB/s
    assert perf.bound_seconds("all_reduce", 16 * mib, 2, limits) == pytest.approx(32 * mib / 100e9, rel=1e-12)
    # reduce_scatter out of place, 64 MiB: 128 MiB read by both at 30 GB/s together
    assert perf.bound_seconds("reduce_scatter", 64 * mib, 2, limits) == pytest.approx(128 * mib / 30e9, rel=1e-12)
    bounds, encoded, table = _symm.memory_bound(2, [("put", False, 1000.0)], limits)
    assert bounds == [1000.0 / 50e9] and encoded == limits and "1 MiB" in table and "64 MiB" in table, table
    for bad, args in [("ranks 0", (0, [])), ('op "reduce"', (2, [("reduce", False, 1.0)], limits)),
                      ("limits", (2, [], "2;1;x")), ("bytes -1", (2, [("put", False, -1.0)], limits))]:
        with pytest.raises(ValueError, match=bad):
            _symm.memory_bound(*args)
    text = run_perf(
        ["-b", "1K", "-e", "1K", "-n", "2", "-w", "1", "-g", "2", "-o", "all_reduce"]
        + ["--backends", "symm", "--bound", "0"],
        tmp_path,
    )
    assert "bound" not in text and "# copy" not in text, text
    rows = [line.split() for line in text.splitlines() if line and not line.startswith("#")]
    assert [len(r) for r in rows] == [5], text  # size, count, time, busbw, #wrong
