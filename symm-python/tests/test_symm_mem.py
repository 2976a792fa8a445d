"""PyTorch's symmetric-memory handle on CPU: ``symm.rendezvous``'s result as
``torch.distributed._symmetric_memory``'s users know it (scenarios_symm_mem.py, 2 and 3 ranks)."""

import inspect

import pytest

import symm
from harness import check_all_passed, run_ranks


@pytest.mark.parametrize("world", [2, 3])
def test_attributes_buffer_ptrs_and_aliasing(world, tmp_path):
    check_all_passed(run_ranks("scenarios_symm_mem.attributes_and_aliasing", world, tmp_path, timeout=90))


@pytest.mark.parametrize("world", [2, 3])
def test_barrier_put_signal_wait_signal(world, tmp_path):
    check_all_passed(run_ranks("scenarios_symm_mem.signals_and_barrier_order", world, tmp_path, timeout=120))


@pytest.mark.parametrize("world", [2, 3])
def test_lifetime_after_the_tensor_and_the_handle_are_dropped(world, tmp_path):
    check_all_passed(run_ranks("scenarios_symm_mem.lifetime", world, tmp_path, timeout=90))


def test_without_peer_mapping_only_the_peer_views_are_unsupported(tmp_path):
    check_all_passed(run_ranks("scenarios_symm_mem.without_peer_mapping", 2, tmp_path, timeout=90))


def test_the_handle_has_pytorchs_names_and_signatures():
    h = symm.SymmetricMemory
    params = lambda f: [(p.name, p.default) for p in list(inspect.signature(f).parameters.values())[1:]]  # noqa: E731
    empty = inspect.Parameter.empty
    assert params(h.get_buffer) == [("rank", empty), ("sizes", empty), ("dtype", empty), ("storage_offset", 0)]
    assert params(h.get_signal_pad) == [("rank", empty), ("sizes", None), ("dtype", None), ("storage_offset", 0)]
    assert params(h.barrier) == [("channel", 0), ("timeout_ms", None)]
    assert params(h.put_signal) == [("dst_rank", empty), ("channel", 0), ("timeout_ms", None)]
    assert params(h.wait_signal) == [("src_rank", empty), ("channel", 0), ("timeout_ms", None)]
    for name in ("buffer_ptrs", "signal_pad_ptrs"):
        assert isinstance(getattr(h, name), property), name
    for name in ("allocation", "peer_address", "peer_buffer"):
        assert callable(getattr(symm._symm.Communicator, name)), name
    assert symm._symm.PeerBuffer.__module__ == "symm._symm"
