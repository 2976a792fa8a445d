"""Tensors without real storage (FakeTensor, wrapper subclasses, storage freed with
``resize_(0)``, views past a shrunk storage, subclasses whose sizes claim more than their storage)
are refused with InvalidArgument at every entry point, on the fast path and the full path, without
a crash and without leaving peers waiting; subclasses whose Python methods misreport are read for
what their C++ tensor holds (scenarios_tensors.py)."""

import pytest

from harness import check_all_passed, run_ranks


@pytest.mark.parametrize("reader", ["handle", "shim", "descriptors"])
def test_tensors_without_storage_are_refused_by_every_collective(tmp_path, reader):
    env = {"SYMM_TEST_FAST_READER": reader}
    check_all_passed(run_ranks("scenarios_tensors.refused_everywhere", 2, tmp_path, env=env, timeout=150))


def test_tensors_without_storage_are_refused_by_send_recv_sendrecv(tmp_path):
    check_all_passed(run_ranks("scenarios_tensors.point_to_point", 2, tmp_path))


def test_tensors_without_storage_are_refused_by_one_sided_calls(tmp_path):
    check_all_passed(run_ranks("scenarios_tensors.one_sided", 2, tmp_path))


def test_subclasses_that_misreport_are_read_for_what_they_hold(tmp_path):
    check_all_passed(run_ranks("scenarios_tensors.misreporting_subclasses", 2, tmp_path))
