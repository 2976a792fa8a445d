"""One rank of a test job: joins the process group, runs ``scenarios.<name>(rank, world)``
(or ``<module>.<name>(rank, world)`` for a name with a dot; several names, comma-separated, in
turn).

Launched by ``harness.run_ranks`` (RANK, WORLD_SIZE, SYMM_TEST_INIT = file:// or tcp:// URL)
or by torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; init through env://).
"""

import datetime
import faulthandler
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    name = sys.argv[1]
    # A rank still running shortly before the harness's deadline prints where it is stuck.
    if "SYMM_TEST_DUMP_AFTER" in os.environ:
        faulthandler.dump_traceback_later(float(os.environ["SYMM_TEST_DUMP_AFTER"]), exit=False)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        # SYMM_TEST_BACKEND=symm: symm's own torch.distributed backend, found by name (its entry
        # point), as a job picks it.
        os.environ.get("SYMM_TEST_BACKEND", "gloo"),
        init_method=os.environ.get("SYMM_TEST_INIT", "env://"),
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )
    import importlib

    # "fn" is scenarios.fn; "module.fn" is a function of another scenario module; several,
    # comma-separated, run one after the other in one job.
    for one in name.split(","):
        module, _, fn = one.rpartition(".")
        getattr(importlib.import_module(module or "scenarios"), fn)(rank, world)
    print(f"SYMM-TEST-PASS rank {rank}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
