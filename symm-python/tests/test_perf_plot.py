"""`python -m symm.perf --plot`: busbw against size from a saved run, without running anything."""

import importlib.util
import json
import sys

import pytest

from symm import perf

#: A run as ``--json`` saves it: 2 ranks, two operations, two sizes, one backend missing in one.
SAVED = {
    "ranks": 2,
    "dtype": "float32",
    "backends": ["symm", "gloo"],
    "in_place": ["all_reduce"],
    "limits": None,
    "results": [
        {"op": "all_reduce", "size": 1024, "times": {"symm": 4e-7, "gloo": 2e-5}, "bound": 1e-8},
        {"op": "all_reduce", "size": 1 << 20, "times": {"symm": 6e-5, "gloo": 9e-4}, "bound": 2e-5},
        {"op": "broadcast", "size": 1024, "times": {"symm": 3e-7, "gloo": None}, "bound": 5e-9},
        {"op": "broadcast", "size": 1 << 20, "times": {"symm": 4e-5, "gloo": 5e-4}, "bound": 1e-5},
    ],
}


def saved_run(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(SAVED))
    return str(path)


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="--plot needs matplotlib (symm[plot])")
def test_plot_draws_a_saved_run(tmp_path):
    out = tmp_path / "plot.png"
    perf.main(["--from", saved_run(tmp_path), "--plot", str(out)])
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_plot_without_matplotlib_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    with pytest.raises(SystemExit, match=r"--plot needs matplotlib: pip install 'symm\[plot\]'"):
        perf.main(["--from", saved_run(tmp_path), "--plot", str(tmp_path / "plot.png")])


def test_from_needs_plot_and_an_empty_run_is_an_error(tmp_path):
    with pytest.raises(SystemExit, match="--from .* needs --plot"):
        perf.main(["--from", saved_run(tmp_path)])
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("the empty-run check draws with matplotlib (symm[plot])")
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({**SAVED, "results": []}))
    with pytest.raises(SystemExit, match="no results"):
        perf.main(["--from", str(empty), "--plot", str(tmp_path / "plot.png")])
