"""Settings from the environment, read by ``symm.init`` (run by worker.py as
``scenarios_config.<name>``): every refused value is a BootstrapError naming the variable, the
value and what is accepted; a value that must agree and differs between ranks is refused on
every rank by name; a default transport format in effect at ``symm.init`` is every group's.
"""

from __future__ import annotations

import contextlib
import os

import torch

import symm
from scenarios import expect

#: (variable, refused value, part of what it accepts), as the error must say them.
REFUSED = [
    ("SYMM_COLL_WORKSPACE", "abc", "a byte size from 64K"),
    ("SYMM_P2P_CHUNK", "0", "from 128 to 16M"),
    ("SYMM_ALLREDUCE_LL_MAX", "garbage", "a byte size, or 0"),
    ("SYMM_STREAM_STORES_MIN", "abc", "a byte size, or 0"),
    ("SYMM_ALLREDUCE_ONESHOT_MAX", "abc", "a byte size, or 0"),
    ("SYMM_LOG_LEVEL", "garbage", "off, error, warn, info, debug, trace"),
    ("SYMM_SPIN_US", "abc", "microseconds from 0 to 1000000"),
    ("SYMM_YIELD_US", "-5", "microseconds from 0 to 1000000"),
    ("SYMM_VALIDATE", "garbage", "1, true, yes, on or 0, false, no, off"),
    ("SYMM_DUMP_ON_SIGNAL", "garbage", "1, true, yes, on or 0, false, no, off"),
    ("SYMM_FAST_PATH", "garbage", "1, true, yes, on or 0, false, no, off"),
    ("SYMMETRIC_MEMORY_TIMEOUT", "1e-9", "seconds from 0.001 to 1e9"),
    ("SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE", "fp7", "float16, bfloat16, float8_e4m3fn, float8_e5m2, none"),
]


@contextlib.contextmanager
def setting(var, value):
    """``var`` set to ``value`` (``None``: as it was) inside the block, as it was after it."""
    old = os.environ.get(var)
    if value is not None:
        os.environ[var] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = old


def refused_settings(rank, world):
    for var, value, accepted in REFUSED:
        with setting(var, value):
            expect(symm.BootstrapError, symm.init, f'{var} = "{value}"', accepted, rank=rank)
    # One rank's workspace differs (the harness sets 1M): every rank refuses the start-up,
    # naming the variable and each rank's value (instead of an allocation size mismatch later).
    with setting("SYMM_COLL_WORKSPACE", "2M" if rank == 1 else None):
        e = expect(symm.BootstrapError, symm.init, "SYMM_COLL_WORKSPACE", "differs between ranks", rank=rank)
        assert 'rank 0: "1048576"' in str(e) and 'rank 1: "2097152"' in str(e), e
    # The default transport format in effect at init is every group's default.
    with setting("SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE", "bfloat16"):
        symm.init()
    x = (torch.arange(4096, dtype=torch.float32) * (rank + 1) / 7.0).contiguous()
    explicit = x.clone()
    symm.shmem_allreduce(explicit, "sum", low_precision_dtype=torch.bfloat16)
    full = x.clone()
    symm.shmem_allreduce(full, "sum", low_precision_dtype="none")
    assert not torch.equal(explicit, full), "bfloat16 transport rounds"
    for group in [None, symm.create_group(list(range(world)))]:
        t = x.clone()
        symm.shmem_allreduce(t, "sum", group)
        assert torch.equal(t, explicit), "the default from the environment equals the explicit format"
        # The default is for floating-point data: integers keep full precision (no error).
        counts = torch.full((300,), (rank + 1) * 1_000_003, dtype=torch.int64)
        symm.shmem_allreduce(counts, "sum", group)
        assert counts.tolist() == [sum(r + 1 for r in range(world)) * 1_000_003] * 300, counts
    symm.barrier()
