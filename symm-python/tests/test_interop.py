"""symm next to torch.distributed (Gloo) in one job: scenarios_interop.py on 4 ranks."""

import pytest

from harness import check_all_passed, run_ranks

#: symm's progress delayed at random, so that the two libraries' work interleaves differently
#: from run to run: correctness must come from each library's own ordering.
DELAYED = {"SYMM_STREAM_DELAY_US": "2000"}


@pytest.mark.parametrize("groups", ["new_group", "hyperparallel", "device_mesh"])
def test_mixed_training_step_equals_the_all_gloo_run(tmp_path, groups):
    env = {**DELAYED, "SYMM_TEST_GROUPS": groups}
    check_all_passed(run_ranks("scenarios_interop.mixed_training_step", 4, tmp_path, env=env, timeout=150))


def test_mixed_training_step_under_validation_raises_nothing(tmp_path):
    # The guard sees every Gloo call of the step: distinct tensors are never refused.
    env = {**DELAYED, "SYMM_TEST_GROUPS": "new_group", "SYMM_VALIDATE": "1"}
    check_all_passed(run_ranks("scenarios_interop.mixed_training_step", 4, tmp_path, env=env, timeout=150))


def test_one_tensor_in_both_libraries_at_once_is_refused_under_validation(tmp_path):
    env = {"SYMM_VALIDATE": "1"}
    check_all_passed(run_ranks("scenarios_interop.forbidden_patterns_are_refused", 4, tmp_path, env=env, timeout=120))
