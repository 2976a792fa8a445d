#!/usr/bin/env bash
# Runs every test of the project: the Rust workspace (unit tests, the conformance suite in
# process and across processes, fault and locality tests), then the Python tests when
# scripts/python-tests.sh is present.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
ensure_cargo

# --release with the checks of a debug build kept on (debug assertions, overflow checks): on a
# 2-core machine this builds the workspace with about half the CPU time of the default test
# profile (full debug info everywhere) and runs the suite as fast, while a test still catches
# what a debug build would. --no-fail-fast: one run reports every failing test binary.
CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true \
    cargo test --workspace --release --no-fail-fast

if [ -x scripts/python-tests.sh ]; then
    scripts/python-tests.sh
elif [ -e scripts/python-tests.sh ]; then
    echo "scripts/python-tests.sh exists but is not executable: the Python tests were NOT run" >&2
    exit 1
fi
