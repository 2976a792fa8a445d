"""HyperParallel's code run unchanged: its compare codes and the names it calls."""

import inspect
import os
import subprocess
import sys

import pytest

import symm
import torch
from harness import check_all_passed, run_ranks


def test_hyperparallel_compare_codes_wait_for_the_data(tmp_path):
    check_all_passed(run_ranks("scenarios_hp.wait_for_signal_codes", 2, tmp_path, timeout=60))


def test_rendezvous_and_signal_pads_on_3_ranks(tmp_path):
    check_all_passed(run_ranks("scenarios_hp.rendezvous_and_signal_pads", 3, tmp_path, timeout=90))


def test_names_hyperparallel_calls_exist_with_its_signatures():
    for name in ("is_shmem_available", "rendezvous", "set_signal_pad_size", "get_signal_pad_size"):
        assert name in symm.__all__ and callable(getattr(symm, name)), name
    params = lambda f: list(inspect.signature(f).parameters)  # noqa: E731
    assert params(symm.rendezvous)[:2] == ["tensor", "group"]
    assert params(symm.set_signal_pad_size) == ["size"] and params(symm.get_signal_pad_size) == []
    assert params(symm.is_shmem_available) == []


def test_is_shmem_available_needs_no_process_group_and_sees_a_missing_backend(monkeypatch):
    # Here the backend can run, before torch.distributed is initialised, and asking starts nothing.
    code = (
        "import symm, torch.distributed as dist\n"
        "print(symm.is_shmem_available(), dist.is_initialized(), symm.is_initialized())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "True False False", out.stdout + out.stderr
    assert symm.is_shmem_available() is True

    def no_memfd(*args):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "memfd_create", no_memfd)
    assert symm.is_shmem_available() is False
    monkeypatch.delattr(os, "memfd_create")
    assert symm.is_shmem_available() is False


def test_is_shmem_available_is_false_for_an_unknown_platform():
    code = "import os; os.environ['SYMM_PLATFORM'] = 'paddle'\nimport symm\nprint(symm.is_shmem_available())\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_signal_pad_size_is_validated_and_kept():
    assert symm.get_signal_pad_size() == symm.DEFAULT_SIGNAL_PAD_SIZE == 4096
    try:
        symm.set_signal_pad_size(256)
        assert symm.get_signal_pad_size() == 256
        for bad, needle in [(0, "0"), (-8, "-8"), (10, "10"), (4.0, "4.0"), ("64", "'64'"), (False, "False")]:
            with pytest.raises(symm.InvalidArgument) as e:
                symm.set_signal_pad_size(bad)
            assert "size = " + needle in str(e.value) and "multiple of 4" in str(e.value), e.value
            assert symm.get_signal_pad_size() == 256
        with pytest.raises(symm.InvalidArgument, match="at most"):
            symm.set_signal_pad_size(1 << 70)
        # A one-element tensor whose storage is gone (as FSDP frees parameters) is not read.
        gone = torch.tensor(64)
        gone.untyped_storage().resize_(0)
        with pytest.raises(symm.InvalidArgument, match="size = <a one-element Tensor without data to read>"):
            symm.set_signal_pad_size(gone)
        assert symm.get_signal_pad_size() == 256
    finally:
        symm.set_signal_pad_size(symm.DEFAULT_SIGNAL_PAD_SIZE)
