"""The platform scenarios (``scenarios_platform.py``) on PyTorch: the same checks
``test_mindspore.py`` runs on MindSpore, on ranks joined by a gloo world."""

import pytest
from harness import check_all_passed, run_ranks

pytest.importorskip("torch")


@pytest.mark.parametrize(
    "scenario,world",
    [
        ("primitives", 2),
        ("groups", 4),
        ("collectives", 4),
        ("low_precision", 2),
        ("autograd", 2),
        ("autograd", 4),
        ("bad_inputs", 2),
    ],
)
def test_platform_scenario_on_torch(tmp_path, scenario, world):
    check_all_passed(run_ranks(f"scenarios_platform.{scenario}", world, tmp_path, timeout=150))
