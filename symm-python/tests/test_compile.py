"""torch.compile over symm's collectives on 2 ranks (scenarios_compile.compiled): a model calling
symm.functional's collectives and functions calling symm.shmem_* compile with fullgraph=True
(one graph, symm's operators in it) and give the eager values and gradients with a recording
backend, "aot_eager" and Inductor; the calls that must run eagerly break the graph and still
match eager mode; torch.library.opcheck passes on every operator, collectively. The ranks share
one Inductor cache (as the ranks of a node do), in the test's directory."""

from harness import check_all_passed, run_ranks


def test_torch_compile_traces_symm_and_opcheck_passes(tmp_path):
    env = {"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    check_all_passed(run_ranks("scenarios_compile.compiled", 2, tmp_path, env=env, timeout=240))
