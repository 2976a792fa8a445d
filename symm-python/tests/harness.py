"""Runs a scenario of ``scenarios.py`` on N spawned ranks and checks that every rank passed.

Each rank is a fresh ``python worker.py <scenario>`` process that joins a gloo process group
through a FileStore or a TCPStore (or through torchrun's own store), so the library is tested
the way a job uses it. Every run is bounded: a rank that fails gives the others ``grace``
seconds (their own waits are bounded by SYMMETRIC_MEMORY_TIMEOUT), and whatever still runs at
the deadline is killed and reported with its output.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest

HERE = Path(__file__).resolve().parent
WORKER = HERE / "worker.py"
MS_WORKER = HERE / "ms_worker.py"
PASS = "SYMM-TEST-PASS"

#: Settings every rank gets unless a test overrides them: a small heap (8 ranks fit easily),
#: a 1 MiB collective workspace per group (instead of 16 MiB: several groups fit in the heap,
#: and large messages take several workspace rounds), a short wait bound (a bug shows up as a
#: Timeout, not a hang), one torch thread per rank (the machine may have 2 cores for 8 ranks).
DEFAULT_ENV = {
    "SYMMETRIC_MEMORY_HEAP_SIZE": "32M",
    "SYMM_COLL_WORKSPACE": "1M",
    "SYMMETRIC_MEMORY_TIMEOUT": "20",
    "OMP_NUM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
    "PYTHONFAULTHANDLER": "1",
}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RankResult:
    rank: int
    returncode: Optional[int]  # None: still running at the deadline, killed
    output: str


def run_perf(args: List[str], tmp_path: Path, *, timeout: float = 120.0) -> str:
    """Runs ``python -m symm.perf`` with ``args`` (which size the heap themselves) and returns
    its standard output; fails the test on a non-zero exit, with both outputs' tails."""
    env = {**os.environ, **{k: v for k, v in DEFAULT_ENV.items() if k != "SYMMETRIC_MEMORY_HEAP_SIZE"}}
    cmd = [sys.executable, "-m", "symm.perf", *args]
    out = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    return out.stdout


def _report(results: List[RankResult], tail: int = 4000) -> str:
    parts = []
    for r in results:
        state = "KILLED (still running at the deadline)" if r.returncode is None else f"exit {r.returncode}"
        parts.append(f"----- rank {r.rank}: {state} -----\n{r.output[-tail:]}")
    return "\n".join(parts)


def _supervise(procs: List[subprocess.Popen], logs: List[Any], timeout: float, grace: float) -> List[RankResult]:
    """Waits for the ranks ``procs`` (output in ``logs``): at most ``timeout`` seconds, and
    ``grace`` seconds after the first one failed; kills what still runs then. Returns each
    rank's result."""
    deadline = time.monotonic() + timeout
    failed_at = None
    killed = set()
    try:
        # Poll every rank each round (not `any`, which stops at the first running one): polling
        # reaps exited ranks at once, and a zombie would look alive to its peers.
        while None in [p.poll() for p in procs]:
            now = time.monotonic()
            if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
                failed_at = now
            if now > deadline or (failed_at is not None and now > failed_at + grace):
                break
            time.sleep(0.05)
    finally:
        for r, p in enumerate(procs):
            if p.poll() is None:
                p.kill()
                p.wait()
                killed.add(r)
    results = []
    for r, (p, log) in enumerate(zip(procs, logs)):
        log.seek(0)
        results.append(RankResult(r, None if r in killed else p.returncode, log.read()))
        log.close()
    return results


def run_ranks(
    scenario: str,
    world: int,
    tmp_path: Path,
    *,
    store: str = "file",
    env: Optional[Dict[str, str]] = None,
    rank_env: Optional[Callable[[int], Dict[str, str]]] = None,
    timeout: float = 90.0,
    grace: float = 30.0,
) -> List[RankResult]:
    """Runs ``scenarios.<scenario>(rank, world)`` on ``world`` processes; returns per-rank results."""
    if store == "file":
        init = f"file://{tmp_path / 'c10d-store'}"
    elif store == "tcp":
        init = f"tcp://127.0.0.1:{free_port()}"
    else:
        raise ValueError(store)
    procs, logs = [], []
    for r in range(world):
        e = {**os.environ, **DEFAULT_ENV, **(env or {}), **(rank_env(r) if rank_env else {})}
        e.update({"RANK": str(r), "WORLD_SIZE": str(world), "SYMM_TEST_INIT": init})
        e["SYMM_TEST_DUMP_AFTER"] = str(max(timeout - 5.0, 1.0))
        log = open(tmp_path / f"rank{r}.log", "w+")
        logs.append(log)
        procs.append(
            subprocess.Popen([sys.executable, str(WORKER), scenario], env=e, stdout=log, stderr=subprocess.STDOUT)
        )
    return _supervise(procs, logs, timeout, grace)


def run_ms_ranks(
    scenario: str,
    world: int,
    tmp_path: Path,
    *,
    env: Optional[Dict[str, str]] = None,
    timeout: float = 150.0,
    grace: float = 45.0,
) -> List[RankResult]:
    """Runs ``<module>.<fn>(rank, world)`` on ``world`` MindSpore workers of a dynamic cluster
    (one scheduler process and the workers, ``ms_worker.py``) on a free loopback port; returns
    per-rank results. A dead worker shows up at its peers only after MindSpore's own 30 s, hence
    the longer bounds."""
    port = free_port()
    base = {**os.environ, **DEFAULT_ENV, **(env or {})}
    base.update(
        MS_WORKER_NUM=str(world),
        MS_SCHED_HOST="127.0.0.1",
        MS_SCHED_PORT=str(port),
        MS_TOPO_TIMEOUT="60",
        GLOG_v="3",
        SYMM_TEST_DUMP_AFTER=str(max(timeout - 5.0, 1.0)),
    )
    sched_log = open(tmp_path / "scheduler.log", "w+")
    sched = subprocess.Popen(
        [sys.executable, str(MS_WORKER), scenario],
        env={**base, "MS_ROLE": "MS_SCHED"},
        stdout=sched_log,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    procs, logs = [], []
    for r in range(world):
        log = open(tmp_path / f"rank{r}.log", "w+")
        logs.append(log)
        e = {**base, "MS_ROLE": "MS_WORKER", "MS_NODE_ID": str(r)}
        procs.append(
            subprocess.Popen(
                [sys.executable, str(MS_WORKER), scenario], env=e, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path
            )
        )
    try:
        return _supervise(procs, logs, timeout, grace)
    finally:
        if sched.poll() is None:
            try:
                sched.wait(timeout=15)
            except subprocess.TimeoutExpired:
                sched.kill()
                sched.wait()
        sched_log.close()


def check_all_passed(results: List[RankResult]) -> None:
    bad = [r for r in results if r.returncode != 0 or PASS not in r.output]
    if bad:
        pytest.fail(f"{len(bad)} of {len(results)} ranks failed\n" + _report(results), pytrace=False)


def run_torchrun(scenario: str, nproc: int, tmp_path: Path, *, timeout: float = 90.0) -> str:
    """Runs the scenario under ``torchrun --standalone`` (its own TCPStore rendezvous)."""
    e = {**os.environ, **DEFAULT_ENV}
    e.pop("SYMM_TEST_INIT", None)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        "--max-restarts=0",
        str(WORKER),
        scenario,
    ]
    try:
        out = subprocess.run(
            cmd, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, cwd=tmp_path
        )
    except subprocess.TimeoutExpired as t:
        pytest.fail(f"torchrun did not finish in {timeout} s\n{t.output or ''}", pytrace=False)
    if out.returncode != 0:
        pytest.fail(f"torchrun exited {out.returncode}\n{out.stdout[-6000:]}", pytrace=False)
    return out.stdout
