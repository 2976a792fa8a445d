"""Diagnostics from Python (run by worker.py as ``scenarios_dfx.<name>``): logging, statistics,
dumps, the SIGUSR1 dump and torch.profiler ranges."""

from __future__ import annotations

import logging
import os
import signal
import time

import torch
import torch.distributed as dist

import symm
from scenarios import expect


def check(cond, what):
    assert cond, what


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelno, record.getMessage()))


def by_op(stats):
    return {s["op"]: s for s in stats}


def dfx(rank, world):
    handler = Records()
    log = logging.getLogger("symm")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    symm.init()
    check(symm.get_log_level() == "error", symm.get_log_level())
    expect(symm.InvalidArgument, lambda: symm.set_log_level("loud"), "level", "loud")

    # statistics: exact calls and bytes
    x = torch.ones(100, dtype=torch.float32)
    out = torch.empty(10 * world, dtype=torch.int32)
    symm.barrier()
    symm.reset_stats()
    for _ in range(3):
        symm.shmem_allreduce(x)
    for _ in range(2):
        symm.shmem_allgather(out, torch.arange(10, dtype=torch.int32))
    symm.barrier()
    s = by_op(symm.stats())
    check(s["allreduce"]["calls"] == 3 and s["allreduce"]["bytes"] == 3 * 400, s)
    check(s["allgather"]["calls"] == 2 and s["allgather"]["bytes"] == 2 * 40, s)
    check(s["barrier"]["calls"] == 1 and s["barrier"]["bytes"] == 0, s)
    check(all(v["errors"] == 0 and v["time"] >= 0 for v in s.values()), s)
    check(set(s["allreduce"]) == {"op", "calls", "bytes", "time", "time_ns", "errors"}, s)
    symm.reset_stats()
    check(symm.stats() == [], symm.stats())

    # the dump and the records show every rank's operations
    text = symm.dump()
    for r in range(world):
        check(f"rank {r} (pid" in text, text)
    check(text.count("allgather") >= 2 * world, text)
    recs = symm.flight_records()
    check(sorted(rr["rank"] for rr in recs) == list(range(world)), recs)
    check(recs[0]["rank"] == rank, recs)
    for rr in recs:
        ops = [e["op"] for e in rr["records"]]
        check("allreduce" in ops and "allgather" in ops, ops)
        ar = [e for e in rr["records"] if e["op"] == "allreduce"][-1]
        check(ar["count"] == 100 and ar["dtype"] == "float32" and ar["state"] == "completed", ar)

    # SIGUSR1 prints the dump to stderr (checked by the test in this rank's output)
    symm.install_dump_on_signal()
    symm.install_dump_on_signal()  # idempotent
    os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(0.3)

    # a forced timeout: rank 0 waits in a barrier of a group that rank 1 never enters
    dist.barrier()
    g = symm.create_group(list(range(world)))
    handler.lines.clear()
    if rank == 0:
        t0 = time.monotonic()
        expect(symm.Timeout, lambda: symm.barrier(g))
        errors = [m for lvl, m in handler.lines if lvl == logging.ERROR]
        check(any("rank 0" in m and "barrier" in m and f"{list(range(world))}" in m for m in errors), errors)
        check(any("flight recorder" in m and "rank 1 (pid" in m for m in errors), errors)
        check(time.monotonic() - t0 < 15, "timeout took too long")
        check(by_op(symm.stats())["barrier"]["errors"] == 1, symm.stats())
    dist.barrier()

    # Log lines of a call that released the GIL by itself while waiting (small calls keep it
    # until they block; PyO3 does not know of that release): on the full path (a rank given as
    # a tensor), a late peer with the debug log on, then a timeout, reach logging and raise
    # normally (the log sink takes the GIL through the C API, which knows of that release).
    rev = symm.create_group(list(reversed(range(world))))
    symm.set_log_level("debug")
    handler.lines.clear()
    if rank == 0:
        time.sleep(0.5)
    t = torch.full((4,), float(rank))
    symm.shmem_broadcast(t, torch.tensor(0), group=rev)
    check(t.tolist() == [float(world - 1)] * 4, t)
    check(any("broadcast" in m and "completed" in m for lvl, m in handler.lines), handler.lines)
    symm.set_log_level("error")
    if rank == 1:
        expect(symm.Timeout, lambda: symm.shmem_recv(torch.empty(2), torch.tensor(1), group=rev), "recv")
        errors = [m for lvl, m in handler.lines if lvl == logging.ERROR]
        check(any("recv" in m and "SYMM_E_TIMEOUT" in m for m in errors), errors)
    else:
        time.sleep(2.5)
    dist.barrier()
    log.removeHandler(handler)
    print("dfx ok", flush=True)


def profiler(rank, world):
    symm.init()
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    for p in model.parameters():  # the same start everywhere
        symm.shmem_broadcast(p.data, 0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.profiler.profile() as prof:
        for _step in range(3):
            x = torch.randn(5, 8)
            h = symm.functional.all_gather(model(x))  # AllGather forward and backward
            loss = h.square().mean()
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                symm.shmem_allreduce(p.grad, "avg")
            opt.step()
    keys = {e.key: e.count for e in prof.key_averages()}
    symm_keys = sorted(k for k in keys if k.startswith("symm::"))
    world_text = "group=world"
    want = {
        f"symm::allreduce(32 x float32, {world_text})": 3,
        f"symm::allreduce(4 x float32, {world_text})": 3,
        f"symm::AllGather.forward(20 x float32, {world_text})": 3,
        f"symm::AllGather.backward({20 * world} x float32, {world_text})": 3,
        f"symm::allgather(20 x float32, {world_text})": 3,
        f"symm::reduce_scatter({20 * world} x float32, {world_text})": 3,
    }
    for k, n in want.items():
        check(keys.get(k) == n, f"{k}: {keys.get(k)} in {symm_keys}")
    # outside the profiler nothing is recorded and the calls still work
    symm.shmem_allreduce(torch.ones(4))
    print("profiler ok", flush=True)
