# Paired A/B of two symm-bench builds (/tmp/bench-old, /tmp/bench-new), alternating order per pair.
# Usage: python3 ab.py OP[,OP...] PAIRS  (2 ranks, 8 B-2 KiB, factor 2; column 6 = out-of-place time, us)
import subprocess, statistics, sys, re
ops = sys.argv[1].split(",")
pairs = int(sys.argv[2])
res = {}
def run(b, op):
    out = subprocess.run([f"/tmp/bench-{b}", op, "-b", "8", "-e", "2K", "-f", "2", "-g", "2"], capture_output=True, text=True).stdout
    rows = {}
    for line in out.splitlines():
        f = line.split()
        if f and f[0].isdigit():
            rows[int(f[0])] = float(f[5])
    return rows
for i in range(pairs):
    for op in ops:
        order = ["old", "new"] if i % 2 == 0 else ["new", "old"]
        r = {b: run(b, op) for b in order}
        for size in r["old"]:
            res.setdefault((op, size), []).append((r["old"][size], r["new"][size]))
for (op, size), v in sorted(res.items()):
    ratios = [n / o for o, n in v]
    print(f"{op:12s} {size:6d}  old best {min(o for o,_ in v):.3f} med {statistics.median(o for o,_ in v):.3f} | new best {min(n for _,n in v):.3f} med {statistics.median(n for _,n in v):.3f} | paired median new/old {statistics.median(ratios):.3f}")
