#!/usr/bin/env bash
# Builds symm in release and runs the demo job: 4 ranks (one process each) exercising put, get,
# signals, put_with_signal, wait_until and barriers in the world and in sub-groups.
# Extra arguments go to the demo (e.g. `--ranks 8`).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
ensure_cargo

cargo build --release -p symm-sim --example demo
exec ./target/release/examples/demo "$@"
