#!/usr/bin/env bash
# Instructions per call of a 1-rank collective, counted by callgrind inside the core's entry
# (deterministic, unlike a timing on a shared machine): two runs of N and 2N iterations, the
# difference divided by N and by the two forms (out of place and in place) symm-bench times.
# Usage: instructions.sh BINARY [OP (all_reduce)] [FUNCTION pattern (*run_allreduce*)] [N (2000)]
# Needs valgrind, and a build whose rustix uses its libc backend (the raw one crashes under
# valgrind: rustix issue 1559).
set -euo pipefail
bin=$1 op=${2:-all_reduce} fn=${3:-*run_allreduce*} n=${4:-2000}
dir=$(mktemp -d)
count() {
    valgrind --tool=callgrind --trace-children=yes --toggle-collect="$fn" \
        --callgrind-out-file="$dir/$1.%p" "$bin" "$op" -b 8 -e 8 -g 1 -n "$1" -w 10 -c 0 >/dev/null 2>"$dir/$1.err"
    grep -h Collected "$dir/$1.err" | awk '{s += $4} END {print s}'
}
a=$(count "$n") b=$(count $((2 * n)))
echo "$bin $op: $(( (b - a) / (2 * n) )) instructions per call in $fn"
rm -rf "$dir"
