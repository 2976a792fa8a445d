"""HyperParallel's code run unchanged: its compare codes and the names it calls."""

from harness import check_all_passed, run_ranks


def test_hyperparallel_compare_codes_wait_for_the_data(tmp_path):
    check_all_passed(run_ranks("scenarios_hp.wait_for_signal_codes", 2, tmp_path, timeout=60))
