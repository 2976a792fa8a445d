"""The RFC's own calls (symm.shmem_*) record their backward when a tensor requires grad in grad
mode (scenarios_autograd.rfc_calls): gradcheck through each call on 2 ranks, the world and a
reversed group; the gradients by hand; refusals that reject the round; a two-stage pipeline."""

from harness import check_all_passed, run_ranks


def test_rfc_calls_are_differentiable(tmp_path):
    check_all_passed(run_ranks("scenarios_autograd.rfc_calls", 2, tmp_path, timeout=150))
