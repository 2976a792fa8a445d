#!/usr/bin/env bash
# Paired A/B of every collective symm-bench has, 2 ranks, 8 B-256 MiB (factor 16, and 256 MiB),
# between two symm-bench binaries: prints per op and size the paired median of B/A (ab.py).
# Usage: final-ab.sh A B [PAIRS (default 9)] [OUTDIR (default: print only)]
# SIZES="-b 8 -e 2K -f 16" (one spec instead of the two) tries it small. WRAP="CMD" runs each
# op's A/B under CMD (one invocation per op, about 2.5 minutes each at the defaults).
set -euo pipefail
a=$1 b=$2 pairs=${3:-9} out=${4:-}
here=$(cd "$(dirname "$0")" && pwd)
ops=(all_reduce reduce_scatter all_gather alltoall sendrecv broadcast)
[[ -n $out ]] && mkdir -p "$out"
for op in "${ops[@]}"; do
    if [[ -n ${SIZES:-} ]]; then
        specs=("$op $SIZES -g 2")
    else
        specs=("$op -b 8 -e 128M -f 16 -g 2" "$op -b 256M -e 256M -g 2")
    fi
    ${WRAP:-} python3 "$here/ab.py" --pairs "$pairs" "$a" "$b" "${specs[@]}" | tee ${out:+"$out/$op.txt"}
done
