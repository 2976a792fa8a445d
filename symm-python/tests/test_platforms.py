"""The platform scenarios (``scenarios_platform.py``) on PyTorch: the same checks
``test_mindspore.py`` runs on MindSpore, on ranks joined by a gloo world."""

import pytest
from harness import check_all_passed, run_ranks

pytest.importorskip("torch")
pytest.importorskip("numpy")

from scenarios_platform import JOBS, job  # noqa: E402 - needs numpy


@pytest.mark.parametrize("world", sorted(JOBS))
def test_platform_scenarios_on_torch(tmp_path, world):
    check_all_passed(run_ranks(job(world), world, tmp_path, timeout=240))
