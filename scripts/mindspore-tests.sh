#!/usr/bin/env bash
# Builds and installs the Python package `symm` into a MindSpore environment and runs its
# MindSpore tests (symm-python/tests/test_mindspore.py: ranks as MindSpore dynamic-cluster and
# msrun jobs, no PyTorch). MindSpore pins numpy<2 and must not share an environment with the
# PyTorch tests, so the environment is a virtualenv of its own in target/tools, created on first
# use: mindspore 2.10.0, numpy<2, pytest, maturin (about 0.8 GB downloaded, 2.8 GB installed).
#
# Environment: PYTHON (default python3; MindSpore 2.10.0 has wheels for CPython 3.10-3.12)
# creates the virtualenv. Extra arguments go to pytest. Exits non-zero when anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
ensure_cargo

PYTHON="${PYTHON:-python3}"
MINDSPORE_VERSION=2.10.0
VENV="$PWD/target/tools/mindspore-$MINDSPORE_VERSION"
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1

if ! "$PYTHON" -c 'import sys; sys.exit(not (3, 10) <= sys.version_info[:2] <= (3, 12))'; then
    echo "$PYTHON is $("$PYTHON" -V 2>&1); MindSpore $MINDSPORE_VERSION needs CPython 3.10, 3.11 or 3.12 (set PYTHON)." >&2
    exit 1
fi
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import mindspore, numpy, pytest, maturin' 2>/dev/null; then
    echo "creating the MindSpore environment $VENV (mindspore $MINDSPORE_VERSION, numpy<2)" >&2
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV" || {
        echo "could not create a virtualenv with $PYTHON -m venv (on Debian: apt-get install python3-venv)" >&2
        exit 1
    }
    "$VENV/bin/python" -m pip install -q "mindspore==$MINDSPORE_VERSION" "numpy<2" "pytest>=7" "maturin>=1.16,<2"
fi

# The same one command of the README, with the environment's interpreter.
"$VENV/bin/python" -m pip install -q ./symm-python

cd symm-python
exec "$VENV/bin/python" -m pytest -p no:cacheprovider -q tests/test_mindspore.py "$@"
