"""Multi-process tests: real ranks (2 to 8 processes) joined by torch.distributed (gloo)."""

import pytest

from harness import check_all_passed, run_ranks, run_torchrun


def test_primitives_on_the_world_of_2_file_store(tmp_path):
    check_all_passed(run_ranks("primitives", 2, tmp_path, store="file"))


def test_groups_in_any_order_split_and_device_mesh_on_4_tcp_store(tmp_path):
    check_all_passed(run_ranks("groups", 4, tmp_path, store="tcp"))


def test_bad_input_raises_the_right_class_on_every_rank_and_nobody_hangs(tmp_path):
    check_all_passed(run_ranks("bad_input", 4, tmp_path, env={"SYMMETRIC_MEMORY_TIMEOUT": "3"}))


def test_world_of_8(tmp_path):
    check_all_passed(run_ranks("world8", 8, tmp_path, timeout=150))


def test_groups_spanning_hosts_are_refused(tmp_path):
    hosts = lambda r: {"SYMM_HOST_ID": "host-a" if r < 2 else "host-b"}  # noqa: E731
    check_all_passed(run_ranks("two_hosts", 4, tmp_path, rank_env=hosts, env={"SYMMETRIC_MEMORY_TIMEOUT": "5"}))


def test_init_for_a_group_makes_it_the_world(tmp_path):
    check_all_passed(run_ranks("per_node_init", 4, tmp_path, store="tcp", env={"SYMMETRIC_MEMORY_TIMEOUT": "5"}))


def test_start_up_errors_then_a_working_start(tmp_path):
    check_all_passed(run_ranks("init_errors", 2, tmp_path, env={"SYMMETRIC_MEMORY_TIMEOUT": "5"}))


def test_under_torchrun(tmp_path):
    out = run_torchrun("torchrun_basic", 2, tmp_path)
    for r in range(2):
        assert f"SYMM-TEST-PASS rank {r}" in out, out[-4000:]


def test_the_harness_reports_a_failing_rank(tmp_path):
    # The harness itself must not pass a job in which a rank fails or hangs.
    results = run_ranks("harness_self_check", 2, tmp_path, timeout=60, grace=3)
    assert results[0].returncode == 0 and results[1].returncode not in (0, None), results
    with pytest.raises(pytest.fail.Exception):
        check_all_passed(results)


def test_a_forked_child_cannot_use_or_close_its_parents_communicator(tmp_path):
    check_all_passed(run_ranks("fork_after_init", 2, tmp_path, env={"SYMMETRIC_MEMORY_TIMEOUT": "10"}))
