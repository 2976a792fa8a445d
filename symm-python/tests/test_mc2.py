"""MC2 fused operators: scenarios_mc2.py on 2 and 4 ranks."""

import os
import subprocess
import sys
import textwrap

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


@pytest.mark.parametrize("world", [2, 3])
def test_device_path_ordering_on_a_stream_double(tmp_path, world):
    """The npu path's logic (side stream, events) on CPU tensors through a test double of the
    stream API: not evidence that a device runs it (scripts/ascend-check.sh does that)."""
    check_all_passed(run_ranks("scenarios_mc2.device_path_on_a_double", world, tmp_path, timeout=180))


AG, RS = "fused_all_gather_matmul", "fused_matmul_reduce_scatter"


def test_torch_ops_registration_decides_per_key_and_keeps_torch_npus_own_kernels():
    """Which (operator, dispatch key) pairs get symm's kernel: CPU always; PrivateUse1 only
    where the privateuse1 backend is torch_npu's ("npu") and torch_npu has no kernel of its own
    for the operator; never a pair already registered."""
    from symm.mc2 import _kernels_to_register as plan

    none = lambda op, key: False  # noqa: E731
    assert plan("privateuseone", none, set()) == [(AG, "CPU"), (RS, "CPU")]
    assert plan("npu", none, set()) == [(AG, "CPU"), (RS, "CPU"), (AG, "PrivateUse1"), (RS, "PrivateUse1")]
    theirs = lambda op, key: (op, key) == (f"symm_mem::{RS}", "PrivateUse1")  # noqa: E731
    assert plan("npu", theirs, {(AG, "CPU"), (RS, "CPU")}) == [(AG, "PrivateUse1")]
    assert plan("npu", none, {(AG, "CPU"), (RS, "CPU"), (AG, "PrivateUse1"), (RS, "PrivateUse1")}) == []


def test_torch_ops_registered_on_privateuse1_named_npu_next_to_torch_npus_own():
    """In a fresh process whose privateuse1 backend is renamed "npu" (as torch_npu does) and
    which already has a PrivateUse1 kernel for matmul + reduce-scatter (standing in for one of
    torch_npu's), ``import symm`` registers its all-gather + matmul kernel there and leaves the
    other one in place (the dispatcher's table says where each kernel was registered). No npu
    tensor can be made here: the kernels' dispatch on npu tensors is for
    scripts/ascend-check.sh."""
    code = textwrap.dedent(
        f"""
        import torch
        import torch.distributed._symmetric_memory
        torch.utils.rename_privateuse1_backend("npu")
        theirs = torch.library.Library("symm_mem", "IMPL")
        theirs.impl("{RS}", lambda *args: None, "PrivateUse1")
        import symm
        import symm.mc2 as mc2
        mc2.register_torch_ops()
        for op in ("{AG}", "{RS}"):
            table = torch._C._dispatch_dump("symm_mem::" + op).splitlines()
            print(op, [line for line in table if line.startswith("PrivateUse1:")])
        print(sorted(mc2._registered))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=os.environ)
    assert out.returncode == 0, out.stdout + out.stderr
    ag, rs, registered = out.stdout.splitlines()
    assert ag.startswith(AG) and "symm/mc2.py" in ag, ag
    assert rs.startswith(RS) and "<string>" in rs and "mc2.py" not in rs, rs
    assert registered == str(sorted([(AG, "CPU"), (AG, "PrivateUse1"), (RS, "CPU")])), registered
