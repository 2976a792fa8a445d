#!/usr/bin/env bash
# Builds and installs the Python package `symm` with the one documented command
# (`pip install ./symm-python`), then runs its tests (symm-python/tests: ranks as processes
# joined by torch.distributed over gloo). From a fresh machine it installs what is missing:
# the Rust toolchain (scripts/common.sh), pip, maturin, pytest and, only when `import torch`
# fails, a CPU build of torch (a large download).
#
# Environment: PYTHON (default python3) picks the interpreter, e.g. one of a virtualenv;
# TORCH_INDEX_URL (default: PyTorch's CPU wheels) is where a missing torch comes from.
# Extra arguments go to pytest (e.g. `-k groups -x`). Exits non-zero when anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
ensure_cargo

PYTHON="${PYTHON:-python3}"
# Quiet pip's advice about running as root and about its own version: CI runs as root.
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1

if ! command -v "$PYTHON" >/dev/null 2>&1; then
    echo "$PYTHON not found: install Python 3.9 or newer (or set PYTHON=/path/to/python)." >&2
    exit 1
fi
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 9))'; then
    echo "$PYTHON is $("$PYTHON" -V 2>&1); symm needs Python 3.9 or newer." >&2
    exit 1
fi
if ! "$PYTHON" -m pip --version >/dev/null 2>&1; then
    echo "pip is missing for $PYTHON: bootstrapping it with ensurepip" >&2
    "$PYTHON" -m ensurepip --upgrade
fi

missing=()
"$PYTHON" -c 'import maturin' 2>/dev/null || missing+=("maturin>=1.16,<2")
"$PYTHON" -c 'import pytest' 2>/dev/null || missing+=("pytest>=7")
# The scenarios shared with MindSpore (tests/scenarios_platform.py) compute expected values in NumPy.
"$PYTHON" -c 'import numpy' 2>/dev/null || missing+=("numpy")
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]}" >&2
    "$PYTHON" -m pip install "${missing[@]}"
fi
if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
    index="${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
    echo "torch is missing: installing the CPU build from $index" >&2
    # The default PyPI wheel also works (it bundles CUDA libraries, a much larger download).
    "$PYTHON" -m pip install torch --index-url "$index" || "$PYTHON" -m pip install torch
fi

# torch.compile's Inductor (tests/test_compile.py) compiles C++ kernels.
ensure_cxx

# The one command of the README: builds the extension (release) with maturin and installs it.
"$PYTHON" -m pip install ./symm-python

# No cache directory in the source tree; tests import the installed package, not python/.
cd symm-python
exec "$PYTHON" -m pytest -p no:cacheprovider -q tests "$@"
