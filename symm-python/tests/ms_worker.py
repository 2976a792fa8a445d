"""One rank of a MindSpore test job: starts MindSpore's communication (the dynamic-cluster
environment ``harness.run_ms_ranks`` sets: MS_ROLE, MS_WORKER_NUM, MS_SCHED_HOST, MS_SCHED_PORT,
MS_NODE_ID), then runs ``<module>.<name>(rank, world)`` (several, comma-separated, in one job) and prints the
pass line.

The scheduler process runs this script too: MindSpore keeps it inside ``init()`` until the
workers are done, so nothing before ``init()`` may have side effects.
"""

import faulthandler
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    import mindspore as ms
    from mindspore import communication

    ms.set_device("CPU")
    communication.init()
    if os.environ.get("MS_ROLE") == "MS_SCHED":
        return
    if "SYMM_TEST_DUMP_AFTER" in os.environ:
        faulthandler.dump_traceback_later(float(os.environ["SYMM_TEST_DUMP_AFTER"]), exit=False)
    os.environ["SYMM_TEST_FRAMEWORK"] = "mindspore"
    rank, world = communication.get_rank(), communication.get_group_size()
    import importlib

    for name in sys.argv[1].split(","):
        module, _, fn = name.rpartition(".")
        getattr(importlib.import_module(module or "scenarios_platform"), fn)(rank, world)
        print(f"rank {rank}: {name} passed", flush=True)
    print(f"SYMM-TEST-PASS rank {rank}", flush=True)


if __name__ == "__main__":
    main()
