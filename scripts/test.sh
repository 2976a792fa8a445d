#!/usr/bin/env bash
# Runs every check of the project, cheapest first, and prints each step's time:
#   fmt      cargo fmt --check
#   ruff     ruff check of the Python package and its tests (pinned version, see RUFF_VERSION)
#   clippy   cargo clippy --workspace --all-targets, warnings denied (the workspace's lints),
#            with and without the `ascend` feature
#   doc      cargo doc --workspace, broken intra-doc links denied
#   rust     cargo test --workspace: unit tests, the conformance suite in process and across
#            processes, fault and locality tests; the diagnostics tests again on the reference
#            collectives (SYMM_COLLECTIVES=reference)
#   python   scripts/python-tests.sh (builds and installs the Python package, runs its tests)
#   mindspore  scripts/mindspore-tests.sh: the package on MindSpore (mindspore 2.10.0, numpy<2,
#            no PyTorch, in a virtualenv of its own under target/tools), its MindSpore tests
#   miri     the unit tests of the kernels, low-precision codecs and copy routines under miri
#            (nightly toolchain, installed with rustup when missing)
#   ascend   the Ascend bindings (ascend-sys) against the headers: ACL's from the torch-npu wheel
#            (downloaded once, without its dependencies, into target/tools), SHMEM's and aclnn's
#            transcribed in ascend-sys/tests/facts; and the registry's tests with the `ascend`
#            feature (no CANN needed: the libraries are loaded at run time)
#   loom     the loom models of the doorbell wait (symm-sim) and of the small-message
#            publication (symm-host), in target/loom
# Arguments name the steps to run (default: all, in this order), e.g. `scripts/test.sh fmt clippy`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
ensure_cargo

# The ruff release the Python code is checked with, installed into target/tools (a newer ruff
# may add findings: change it here, deliberately).
RUFF_VERSION=0.17.6
PYTHON="${PYTHON:-python3}"

ALL_STEPS=(fmt ruff clippy doc rust python mindspore ascend miri loom)
STEPS=("$@")
[ ${#STEPS[@]} -gt 0 ] || STEPS=("${ALL_STEPS[@]}")
for s in "${STEPS[@]}"; do
    [[ " ${ALL_STEPS[*]} " == *" $s "* ]] || { echo "unknown step '$s' (steps: ${ALL_STEPS[*]})" >&2; exit 2; }
done

step_fmt() {
    ensure_component rustfmt
    cargo fmt --all --check
}

step_ruff() {
    local dir="target/tools/ruff-$RUFF_VERSION"
    if [ ! -x "$dir/bin/ruff" ]; then
        echo "installing ruff $RUFF_VERSION into $dir" >&2
        PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore \
            "$PYTHON" -m pip install -q --target "$dir" "ruff==$RUFF_VERSION" || {
            echo "could not install ruff $RUFF_VERSION with $PYTHON -m pip (set PYTHON, or install pip)" >&2
            exit 1
        }
    fi
    # Configured in symm-python/pyproject.toml; the cache stays out of the source tree.
    RUFF_CACHE_DIR=target/tools/ruff-cache "$dir/bin/ruff" check symm-python/python symm-python/tests
}

step_clippy() {
    ensure_component clippy
    cargo clippy --workspace --all-targets -- -D warnings
    cargo clippy --workspace --all-targets --features ascend -- -D warnings
}

step_doc() {
    RUSTDOCFLAGS="-D rustdoc::broken_intra_doc_links" cargo doc --workspace --no-deps
}

step_rust() {
    # --release with the checks of a debug build kept on (debug assertions, overflow checks): on
    # a 2-core machine this builds the workspace with about half the CPU time of the default test
    # profile (full debug info everywhere) and runs the suite as fast, while a test still catches
    # what a debug build would. --no-fail-fast: one run reports every failing test binary.
    # Without the release profile's whole-program optimisation (lto), which would link each of
    # the dozens of test binaries that way: it changes no behaviour, only how fast the
    # benchmarks and the Python module run.
    CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true \
        CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true cargo test --workspace --release --no-fail-fast
    # The diagnostics on the reference collectives (the conformance suite runs them itself): the
    # flight recorder, statistics, log lines, concurrent use, refusal after a timeout, and the
    # alltoall mismatch named on every rank.
    SYMM_COLLECTIVES=reference CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true \
        CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true cargo test --release -p symm-tests --test dfx --test dfx_faults -- \
        --skip ranks_out_of_step --skip a_rank_that_never_arrives
}

step_python() {
    if [ ! -x scripts/python-tests.sh ]; then
        echo "scripts/python-tests.sh is missing or not executable: the Python tests were NOT run" >&2
        exit 1
    fi
    PYTHON="$PYTHON" scripts/python-tests.sh
}

step_mindspore() {
    PYTHON="$PYTHON" scripts/mindspore-tests.sh
}

# The torch-npu wheel whose ACL headers the bindings are checked against (any Python tag: the
# headers are the same; this one is pinned so that the check is reproducible).
TORCH_NPU_WHEEL_VERSION=2.14.0

step_ascend() {
    local dir="target/tools/torch-npu-$TORCH_NPU_WHEEL_VERSION"
    local inc="$dir/torch_npu/include/third_party/acl/inc"
    if [ ! -f "$inc/acl/acl.h" ]; then
        echo "downloading the torch-npu $TORCH_NPU_WHEEL_VERSION wheel (its headers only are kept) into $dir" >&2
        rm -rf "$dir" && mkdir -p "$dir/wheel"
        PIP_DISABLE_PIP_VERSION_CHECK=1 "$PYTHON" -m pip download -q --no-deps --only-binary=:all: \
            --python-version 3.11 --platform manylinux_2_28_x86_64 -d "$dir/wheel" \
            "torch-npu==$TORCH_NPU_WHEEL_VERSION" || {
            echo "could not download torch-npu $TORCH_NPU_WHEEL_VERSION with $PYTHON -m pip" >&2
            exit 1
        }
        "$PYTHON" - "$dir" <<'PY'
import glob, sys, zipfile
dest = sys.argv[1]
with zipfile.ZipFile(glob.glob(dest + "/wheel/*.whl")[0]) as z:
    z.extractall(dest, [n for n in z.namelist() if n.startswith("torch_npu/include/third_party/")])
PY
        rm -rf "$dir/wheel"
    fi
    ensure_cxx
    # ascend-sys against ACL's headers (and the SHMEM and aclnn transcriptions); symm-hccl against
    # HCCL's, which the same wheel ships beside ACL's (its hccl.h includes acl/acl.h).
    SYMM_ASCEND_HEADERS="$PWD/$inc" SYMM_HCCL_HEADERS="$PWD/$dir/torch_npu/include/third_party/hccl/inc" \
        CARGO_PROFILE_RELEASE_LTO=false \
        cargo test --release -p ascend-sys -p symm-hccl --test headers -- --include-ignored
    # The backend through the registry, on this machine without CANN (docs/ascend.md).
    CARGO_PROFILE_RELEASE_LTO=false cargo test --release -p symm-registry --features ascend
}

step_miri() {
    ensure_miri
    # The tests of the code that does raw-pointer and SIMD work on buffers; miri runs them about
    # a thousand times slower, so under cfg(miri) they use small sizes and fewer cases (each
    # unsafe path still runs, across block boundaries): about two minutes on 2 cores.
    cargo +nightly miri test -p symm-core --lib -- coll::kernels:: coll::lowp:: coll::copy::
}

step_loom() {
    # Its own target directory: --cfg loom would otherwise rebuild the main build's cache.
    RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom CARGO_PROFILE_RELEASE_LTO=false \
        cargo test --release -p symm-host -p symm-sim --lib loom
}

times=()
total_start=$SECONDS
for s in "${STEPS[@]}"; do
    echo "=== $s" >&2
    start=$SECONDS
    "step_$s"
    times+=("$(printf '%-7s %5d s' "$s" $((SECONDS - start)))")
    echo "=== $s passed in $((SECONDS - start)) s" >&2
done
echo "=== every step passed:" >&2
printf '    %s\n' "${times[@]}" "$(printf '%-7s %5d s' total $((SECONDS - total_start)))" >&2
