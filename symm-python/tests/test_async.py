"""Asynchronous operations (``async_op=True``) on real ranks: scenarios_async.py."""

import time

from harness import check_all_passed, run_perf, run_ranks


def test_every_async_call_leaves_what_the_blocking_form_does(tmp_path):
    check_all_passed(run_ranks("scenarios_async.results", 2, tmp_path, timeout=150))


def test_async_results_on_3_ranks_with_delayed_streams(tmp_path):
    # every stream operation delayed at random: correctness comes from ordering, not timing
    env = {"SYMM_STREAM_DELAY_US": "300"}
    check_all_passed(run_ranks("scenarios_async.results", 3, tmp_path, env=env, timeout=200))


def test_many_in_flight_waited_in_reverse_futures_and_is_completed(tmp_path):
    check_all_passed(run_ranks("scenarios_async.in_flight", 2, tmp_path))


def test_async_waits_time_out_naming_the_stream_and_a_lost_peer_fails_the_work(tmp_path):
    check_all_passed(run_ranks("scenarios_async.timeouts", 2, tmp_path, env={"SYMMETRIC_MEMORY_TIMEOUT": "3"}))


def test_async_argument_errors_reject_the_round_and_mismatches_surface_from_wait(tmp_path):
    t0 = time.monotonic()
    check_all_passed(run_ranks("scenarios_async.errors", 2, tmp_path, env={"SYMMETRIC_MEMORY_TIMEOUT": "20"}))
    assert time.monotonic() - t0 < 60


def test_validation_detects_a_tensor_still_in_flight(tmp_path):
    check_all_passed(run_ranks("scenarios_async.validate", 2, tmp_path, env={"SYMM_VALIDATE": "1"}))


def test_perf_async_op_times_every_op_through_async_calls_and_checks_results(tmp_path):
    text = run_perf(
        ["-b", "1K", "-e", "16K", "-f", "16", "-n", "3", "-w", "1", "-g", "2", "--async-op", "--bound", "0"],
        tmp_path,
    )
    assert "async_op=True" in text, text
    for op in ("all_reduce", "reduce_scatter", "all_gather", "alltoall", "sendrecv", "broadcast"):
        assert f"# {op}" in text, text
    rows = [line.split() for line in text.splitlines() if line and not line.startswith("#")]
    assert len(rows) == 6 * 2, text
    assert "wrong elements in total: 0" in text, text
