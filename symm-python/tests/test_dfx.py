"""Diagnostics: exception classes for every error code, logging, statistics, dumps, profiler."""

import subprocess
import sys

import symm
from harness import check_all_passed, run_ranks


def test_every_error_code_of_the_core_has_its_own_exception_class():
    codes = symm._symm.error_codes()
    assert "SYMM_E_PEER_EXITED" in codes and "SYMM_E_CONCURRENT_USE" in codes
    classes = {}
    for name in symm.__all__:
        obj = getattr(symm, name)
        if isinstance(obj, type) and issubclass(obj, symm.SymmError) and obj is not symm.SymmError:
            assert obj.code not in classes, (obj, classes.get(obj.code))
            classes[obj.code] = obj
    missing = [c for c in codes if c not in classes]
    assert not missing, f"codes without a class (they would fall back to SymmError): {missing}"
    assert set(classes) == set(codes), set(classes) - set(codes)
    assert issubclass(symm.PeerExited, symm.PeerLost)
    assert symm.PeerExited.code == "SYMM_E_PEER_EXITED"
    assert issubclass(symm.ConcurrentUse, symm.SymmError) and not issubclass(symm.ConcurrentUse, symm.PeerLost)


def test_log_level_names_and_bad_input():
    code = (
        "import symm, logging\n"
        "assert symm.get_log_level() == 'warn', symm.get_log_level()\n"
        "for name in ('off', 'error', 'warn', 'info', 'debug', 'trace'):\n"
        "    symm.set_log_level(name); assert symm.get_log_level() == name\n"
        "symm.set_log_level(logging.INFO); assert symm.get_log_level() == 'info'\n"
        "symm.set_log_level(None); assert symm.get_log_level() == 'off'\n"
        "for bad in ('loud', 3.5, b'x'):\n"
        "    try:\n"
        "        symm.set_log_level(bad)\n"
        "    except symm.InvalidArgument as e:\n"
        "        assert 'level' in str(e), e\n"
        "    else:\n"
        "        raise AssertionError(bad)\n"
        "assert symm.stats() == [] and symm.flight_records() == [] and 'not initialised' in symm.dump()\n"
    )
    env = {"SYMM_LOG_LEVEL": "warn", "PATH": "/usr/bin:/bin"}
    import os

    env = {**os.environ, **env}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_logging_stats_dump_and_signal_dump_on_2_ranks(tmp_path):
    results = run_ranks("scenarios_dfx.dfx", 2, tmp_path, env={"SYMMETRIC_MEMORY_TIMEOUT": "2"}, timeout=90)
    check_all_passed(results)
    for r in results:
        assert "[symm] dump requested by signal" in r.output, r.output[-3000:]
        assert "allgather" in r.output.split("dump requested by signal", 1)[1], r.output[-3000:]


def test_every_call_shows_up_in_torch_profiler_with_name_and_size(tmp_path):
    check_all_passed(run_ranks("scenarios_dfx.profiler", 2, tmp_path, timeout=90))
