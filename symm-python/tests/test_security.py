"""Start-up security and failure handling over torch's store (see scenarios_security.py)."""

import secrets

from harness import check_all_passed, run_ranks


def test_a_forged_record_in_torchs_store_is_rejected_with_a_job_secret(tmp_path):
    env = {"SYMM_JOB_SECRET": secrets.token_hex(32), "SYMM_LOG_LEVEL": "warn"}
    results = run_ranks("scenarios_security.forged_hello_with_a_secret", 2, tmp_path, store="tcp", env=env)
    check_all_passed(results)
    assert "rejected the start-up record" in results[0].output, results[0].output[-3000:]


def test_without_a_job_secret_the_process_group_shares_one(tmp_path):
    env = {"SYMM_LOG_LEVEL": "warn"}
    scenario = "scenarios_security.forged_hello_with_the_process_groups_secret"
    results = run_ranks(scenario, 2, tmp_path, store="tcp", env=env)
    check_all_passed(results)
    assert "rejected the start-up record" in results[0].output, results[0].output[-3000:]


def test_unauthenticated_a_forged_record_fails_the_start_up_by_name(tmp_path):
    check_all_passed(run_ranks("scenarios_security.forged_hello_unauthenticated", 2, tmp_path, store="tcp"))


def test_a_rank_with_a_bad_setting_makes_its_peer_fail_at_once(tmp_path):
    check_all_passed(run_ranks("scenarios_security.a_peer_with_a_bad_setting", 2, tmp_path, store="tcp"))
