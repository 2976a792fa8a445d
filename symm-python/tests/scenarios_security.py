"""Scenarios of the start-up's security and failure handling (run by test_security.py).

Anyone who reaches torch's store (its TCP port, its file) can write into it. Here rank 1 plays
that someone: before rank 1's own start-up it writes a garbage record where rank 1's "hello"
goes, and rank 0 starts while the garbage is there.
"""

from __future__ import annotations

import hashlib
import os
import time

import torch.distributed as dist

import symm
from scenarios import expect, works


def _store(world):
    # Where symm.init() exchanges for the whole world (see _api.init).
    digest = hashlib.sha1(",".join(map(str, range(world))).encode()).hexdigest()[:16]
    return symm._api.get_platform().store(f"symm/{world}-{digest}/")


def _forge_rank1_hello(rank):
    if rank == 1:
        _store(2).set("boot1/0/hello/1", b"not a hello")
        # Rank 1 writes its own hello a second after rank 0 is ready to read it (after the
        # secret is shared, which is a collective).
        platform = symm._api.get_platform()
        share = platform.share_secret

        def late(group, ranks):
            secret = share(group, ranks)
            time.sleep(1.0)
            return secret

        platform.share_secret = late
    # Rank 0 starts only once the forged record is there.
    dist.barrier()


def forged_hello_with_a_secret(rank, world):
    assert os.environ.get("SYMM_JOB_SECRET"), "run with SYMM_JOB_SECRET"
    _forge_rank1_hello(rank)
    # Rank 0 rejects the forged record and waits for rank 1's genuine one, which replaces it.
    t = time.monotonic()
    symm.init()
    assert time.monotonic() - t < 15
    works(rank, world)


def forged_hello_with_the_process_groups_secret(rank, world):
    # No SYMM_JOB_SECRET: symm.init() shares a fresh one over the process group (gloo), which
    # whoever writes into the store never sees; the forged record is rejected all the same.
    assert not os.environ.get("SYMM_JOB_SECRET")
    _forge_rank1_hello(rank)
    symm.init()
    works(rank, world)


def forged_hello_unauthenticated(rank, world):
    # What is not protected: with neither SYMM_JOB_SECRET nor a platform that can share a
    # secret, a forged record is taken for a rank's own. The start-up fails (it cannot succeed
    # with a forged peer), naming the record; the peer learns it at once.
    assert not os.environ.get("SYMM_JOB_SECRET")
    symm._api.get_platform().share_secret = lambda group, ranks: None
    _forge_rank1_hello(rank)
    if rank == 0:
        expect(symm.BootstrapError, lambda: symm.init(), "rank 1 sent an unreadable hello", rank=0)
    else:
        expect(symm.BootstrapError, lambda: symm.init(), "a peer failed during start-up", rank=1)
    dist.barrier()
    symm.init()
    works(rank, world)


def a_peer_with_a_bad_setting(rank, world):
    # Rank 1's heap size is malformed: rank 1 fails on it, rank 0 learns it from the store at
    # once (not after SYMMETRIC_MEMORY_TIMEOUT, 20 s here).
    good = os.environ["SYMMETRIC_MEMORY_HEAP_SIZE"]
    if rank == 1:
        os.environ["SYMMETRIC_MEMORY_HEAP_SIZE"] = "12Q"
    t = time.monotonic()
    if rank == 0:
        expect(symm.BootstrapError, lambda: symm.init(), "a peer failed during start-up", "12Q", rank=0)
        assert time.monotonic() - t < 10, time.monotonic() - t
    else:
        expect(symm.BootstrapError, lambda: symm.init(), "SYMMETRIC_MEMORY_HEAP_SIZE", "12Q", rank=1)
        os.environ["SYMMETRIC_MEMORY_HEAP_SIZE"] = good
    dist.barrier()
    symm.init()
    works(rank, world)
