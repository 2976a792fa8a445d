"""Settings from the environment on real ranks: refused values and disagreements at init."""

from harness import check_all_passed, run_ranks


def test_refused_settings_name_the_variable_and_disagreements_fail_every_rank(tmp_path):
    check_all_passed(
        run_ranks("scenarios_config.refused_settings", 2, tmp_path, env={"SYMMETRIC_MEMORY_TIMEOUT": "10"})
    )
