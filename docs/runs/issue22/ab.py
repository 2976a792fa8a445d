#!/usr/bin/env python3
"""Paired A/B of two symm-bench binaries: the runs alternate, and each pair's ratio is taken.

Usage: ab.py [--pairs N] [--env-a K=V] [--env-b K=V] [--in-place] [--fresh-copy] A B SPEC [SPEC ...]

SPEC is one symm-bench command line after the binary, e.g. "broadcast -b 8 -e 2K -f 4 -g 2".
In every pair each SPEC runs once on A and once on B, A first in even pairs and B first in odd
ones. --env-a / --env-b set environment variables for one side only (the same binary twice with
and without SYMM_TIMING=1, say). Printed per SPEC and size: the best and median time (us,
out of place; --in-place: in place) of A and B, and the median over the pairs of B/A.

--fresh-copy runs each time a new copy of the binary (same name length for A and B): the copy
gets new physical pages for its code, so that where the page cache happens to hold one file
(which moves a small call's time by up to 18 % for one and the same binary, cache-set
conflicts) becomes noise that the pairs average out instead of a bias of one side.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile


def run(binary, spec, env, column, fresh_copy=False):
    if fresh_copy:
        with tempfile.TemporaryDirectory(prefix="ab-") as d:
            copy = shutil.copy2(binary, f"{d}/bin")
            return run(copy, spec, env, column)
    out = subprocess.run([binary, *spec.split()], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        sys.exit(f"{binary} {spec}: exit {out.returncode}\n{out.stderr}")
    rows = {}
    for line in out.stdout.splitlines():
        f = line.split()
        if f and f[0].isdigit() and f[column] != "N/A":
            rows[int(f[0])] = float(f[column])
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=9)
    p.add_argument("--env-a", action="append", default=[])
    p.add_argument("--env-b", action="append", default=[])
    p.add_argument("--in-place", action="store_true")
    p.add_argument("--fresh-copy", action="store_true")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("specs", nargs="+")
    args = p.parse_args()
    column = 9 if args.in_place else 5
    env = {s: dict(os.environ, **dict(kv.split("=", 1) for kv in kvs)) for s, kvs in (("a", args.env_a), ("b", args.env_b))}
    binary = {"a": args.a, "b": args.b}
    res = {}
    for i in range(args.pairs):
        for spec in args.specs:
            order = "ab" if i % 2 == 0 else "ba"
            r = {s: run(binary[s], spec, env[s], column, args.fresh_copy) for s in order}
            for size in r["a"].keys() & r["b"].keys():
                res.setdefault((spec, size), []).append((r["a"][size], r["b"][size]))
    print(f"# A {args.a} {' '.join(args.env_a)}\n# B {args.b} {' '.join(args.env_b)}\n# {args.pairs} pairs, {'in' if args.in_place else 'out of'} place")
    for spec in args.specs:
        for size in sorted(s for (sp, s) in res if sp == spec):
            v = res[(spec, size)]
            a, b = [x for x, _ in v], [y for _, y in v]
            ratio = statistics.median(y / x for x, y in v)
            print(f"{spec:36s} {size:>10d}  A best {min(a):8.3f} med {statistics.median(a):8.3f} | B best {min(b):8.3f} med {statistics.median(b):8.3f} | B/A paired median {ratio:.3f}")


if __name__ == "__main__":
    main()
