#!/bin/bash
# Instructions per call of rank 0 of a 2-rank symm-bench run, counted by callgrind.
#
# Usage: percall.sh BINARY OP [BYTES]   (e.g. percall.sh target/release/symm-bench sendrecv 8)
# Needs valgrind (Debian: apt-get install valgrind), which the README does not install.
#
# Rank 0 runs under callgrind, rank 1 natively (so rank 0, about 50x slower, seldom waits: its
# count is the call's own work, not a spin). The ranks are started by hand, without the
# launcher, with fixed memory rates in place of the launcher's measurement. Two runs of 20,000
# and 40,000 timed calls; their difference over 20,000 is the count per call, start-up and
# warm-up cancelled. The callgrind files stay in $OUT (default /tmp/percall) for
# callgrind_annotate.
set -euo pipefail
BIN=$(realpath "$1"); OP=$2; BYTES=${3:-8}
OUT=${OUT:-/tmp/percall}; mkdir -p "$OUT"
count() {
    local n=$1 tag=$2 port=$((20000 + RANDOM % 20000))
    export SYMM_WORLD_SIZE=2 SYMM_RENDEZVOUS=127.0.0.1:$port SYMMETRIC_MEMORY_HEAP_SIZE=67108864 \
        SYMM_BENCH_MEMORY_LIMITS="2;1;4096:10,10:10,10;268435456:10,10:10,10"
    local args=("$OP" -b "$BYTES" -e "$BYTES" -n "$n" -w 10 -g 2 -c 0)
    SYMM_RANK=0 valgrind --tool=callgrind --callgrind-out-file="$OUT/$tag.out" "$BIN" "${args[@]}" \
        >"$OUT/$tag.log" 2>&1 &
    local r0=$!
    sleep 0.5
    SYMM_RANK=1 "$BIN" "${args[@]}" >"$OUT/$tag.rank1.log" 2>&1
    wait $r0
    grep -o 'Collected : [0-9]*' "$OUT/$tag.log" | grep -o '[0-9]*$'
}
tag=$(basename "$BIN")-$OP-$BYTES
a=$(count 20000 "$tag-20k"); b=$(count 40000 "$tag-40k")
echo "$BIN $OP $BYTES B: $(( (b - a) / 20000 )) instructions per call (rank 0)"
