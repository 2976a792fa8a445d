"""MC2 fused operators: scenarios_mc2.py on 2 and 4 ranks."""

import pytest

from harness import check_all_passed, run_ranks


@pytest.mark.parametrize("world", [2, 4])
def test_hyperparallel_fused_ops_world_subgroup_repeated_and_refusals(tmp_path, world):
    check_all_passed(run_ranks("scenarios_mc2.hyperparallel_api", world, tmp_path, timeout=120))


def test_pytorch_symm_mem_fused_ops_on_cpu_and_under_compile(tmp_path):
    check_all_passed(run_ranks("scenarios_mc2.torch_ops", 2, tmp_path, timeout=240))


@pytest.mark.parametrize("world", [2, 4])
def test_fused_ops_gradcheck(tmp_path, world):
    check_all_passed(run_ranks("scenarios_mc2.gradients", world, tmp_path, timeout=180))
