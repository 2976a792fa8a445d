"""Groups spanning (simulated) hosts: hierarchical collectives against gloo on the same ranks."""

import pytest

from harness import check_all_passed, run_ranks


@pytest.mark.parametrize("layout", ["2,2", "3,1"])
def test_collectives_of_groups_spanning_hosts_match_gloo(tmp_path, layout):
    sizes = [int(s) for s in layout.split(",")]
    host_of = [h for h, size in enumerate(sizes) for _ in range(size)]
    hosts = lambda r: {"SYMM_HOST_ID": f"host-{'ab'[host_of[r]]}"}  # noqa: E731
    results = run_ranks(
        "scenarios_hier.hierarchical",
        sum(sizes),
        tmp_path,
        store="tcp",
        env={"HIER_HOSTS": layout, "SYMMETRIC_MEMORY_TIMEOUT": "30"},
        rank_env=hosts,
        timeout=240,
    )
    check_all_passed(results)
