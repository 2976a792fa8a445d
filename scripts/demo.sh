#!/usr/bin/env bash
# The main job: builds in release, runs the 4-rank demo of the primitives (world and sub-groups,
# every result checked), then a short benchmark of allreduce on 2 ranks in the style of
# nccl-tests (every result checked, #wrong column).
# Extra arguments go to the demo (e.g. `--ranks 8`).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
ensure_cargo

cargo build --release -p symm-sim --example demo -p symm-benches --bin symm-bench
./target/release/examples/demo "$@"
echo
./target/release/symm-bench all_reduce -b 8 -e 64M -f 8 -g 2
