#!/usr/bin/env bash
# Runs the nccl-tests-style benchmark of the CPU backend for every collective on 2, 4 and 8
# ranks (ranks pinned to cores, buffers in the symmetric heap) and prints the tables that
# docs/performance.md records. Usage: scripts/bench.sh [max-bytes] [ranks...]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
ensure_cargo
max=${1:-64M}
shift || true
ranks=("${@:-2 4 8}")
cargo build --release -p symm-benches --bin symm-bench
for g in ${ranks[*]}; do
    for op in all_reduce reduce_scatter all_gather alltoall sendrecv broadcast; do
        echo "## $op, $g ranks"
        target/release/symm-bench "$op" -b 8 -e "$max" -f 8 -g "$g"
        echo
    done
done
