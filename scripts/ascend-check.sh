#!/usr/bin/env bash
# What a person with an Ascend node (CANN installed, its set_env.sh sourced) runs to check the
# Ascend backend there:
#   1. builds the workspace with the `ascend` feature and runs the tests of ascend-sys,
#      symm-ascend and the registry (the loader finds CANN: the start-up test then has nothing to
#      show and says so);
#   2. runs the conformance cases whose buffers all live in the heap (primitives and
#      collectives, `symm-conformance-rank --device-cases`) on 2, 4 and 8 ranks, one process per
#      device, started by this script through the CPU backend's launcher conventions
#      (SYMM_RANK, SYMM_WORLD_SIZE, SYMM_RENDEZVOUS);
#   3. prints symm-bench's nccl-tests table of each collective on 2, 4 and 8 ranks
#      (`ASCEND_CHECK_MAX_BYTES`, default 64M, the largest size), every result checked;
#   4. where torch_npu imports: installs the Python package built with the backend and runs
#      symm-python/tests/npu_smoke.py (npu tensors, the caller's stream, low-precision
#      transport against the CPU backend's bytes, the mixed step: symm's allreduce then
#      HCCL's all-gather, a side stream ordered by symm.stream_event; the MC2 fused operators
#      on npu tensors, pipelined on a side stream, against the unfused computation on the CPU,
#      their backward and PyTorch's torch.ops.symm_mem forms) under torchrun on 2 and on every
#      device;
#   5. there too: benches/mc2_bench.py on 2 devices, the MC2 fused operators against the
#      unfused sequence on npu tensors (float16; `ASCEND_CHECK_MC2_SHAPES` the shapes);
#   6. says what is not yet there to run (docs/ascend.md, "Not yet").
# Each rank's output is kept under target/ascend-check/<ranks>/rank<r>.log.
#
# Variables: ASCEND_CHECK_DEVICES (devices to use, default: what `npu-smi` counts, else 8);
# ASCEND_CHECK_BACKEND (default ascend; `sim` runs step 2 on the CPU backend, which is how the
# script itself is tested where there is no device); ASCEND_CHECK_TIMEOUT (seconds per run,
# default 300); ASCEND_CHECK_MC2_SHAPES (step 5's `m x k x n` shapes, comma-separated).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/common.sh
ensure_cargo

BACKEND="${ASCEND_CHECK_BACKEND:-ascend}"
TIMEOUT="${ASCEND_CHECK_TIMEOUT:-300}"
OUT=target/ascend-check

devices() {
    if [ -n "${ASCEND_CHECK_DEVICES:-}" ]; then
        echo "$ASCEND_CHECK_DEVICES"
    elif command -v npu-smi >/dev/null; then
        npu-smi info -l | grep -c "NPU ID" || echo 0
    else
        echo 8
    fi
}

echo "== build and unit tests with the ascend feature"
cargo build --release --features ascend -p symm-tests --bin symm-conformance-rank -p symm-benches --bin symm-bench
cargo test --release -p ascend-sys -p symm-ascend -p symm-hccl
cargo test --release -p symm-registry --features ascend

# Starts `n` ranks of the conformance binary on the given cases; rank 0 serves the store.
run_ranks() {
    local n=$1
    shift
    local dir="$OUT/$n" port=$((20000 + RANDOM % 20000)) pids=() failed=0
    rm -rf "$dir" && mkdir -p "$dir"
    for ((r = 0; r < n; r++)); do
        # Heap-only buffers and the reference collectives: what the Ascend backend does by
        # itself, and what makes the CPU backend (ASCEND_CHECK_BACKEND=sim) run the same.
        SYMM_TEST_HEAP_ONLY=1 SYMM_COLLECTIVES=reference SYMM_BACKEND="$BACKEND" \
            SYMM_RANK=$r SYMM_WORLD_SIZE=$n SYMM_RENDEZVOUS="127.0.0.1:$port" \
            SYMMETRIC_MEMORY_HEAP_SIZE="${SYMMETRIC_MEMORY_HEAP_SIZE:-64M}" SYMMETRIC_MEMORY_TIMEOUT=60 \
            timeout "$TIMEOUT" target/release/symm-conformance-rank "$@" >"$dir/rank$r.log" 2>&1 &
        pids+=($!)
    done
    for ((r = 0; r < n; r++)); do
        wait "${pids[$r]}" || { failed=1; echo "rank $r of $n failed; its output ($dir/rank$r.log):" >&2; tail -n 20 "$dir/rank$r.log" >&2; }
    done
    return $failed
}

# The conformance cases whose buffers all live in the heap (symm_tests::DEVICE_CASES): the
# primitives and the collectives.
read -r -a CASES <<<"$(target/release/symm-conformance-rank --device-cases)"
have=$(devices)
status=0
echo "== conformance cases (${CASES[*]}) on the $BACKEND backend, $have devices"
for n in 2 4 8; do
    if [ "$n" -gt "$have" ]; then
        echo "$n ranks: skipped ($have devices)"
        continue
    fi
    if run_ranks "$n" "${CASES[@]}"; then
        echo "$n ranks: passed"
    else
        echo "$n ranks: FAILED"
        status=1
    fi
done

echo "== symm-bench on the $BACKEND backend (nccl-tests columns; every result checked)"
for n in 2 4 8; do
    [ "$n" -le "$have" ] || continue
    for op in all_reduce reduce_scatter all_gather alltoall broadcast sendrecv; do
        SYMM_BACKEND="$BACKEND" SYMMETRIC_MEMORY_TIMEOUT=60 timeout "$TIMEOUT" \
            target/release/symm-bench "$op" -g "$n" -b 8 -e "${ASCEND_CHECK_MAX_BYTES:-64M}" -f 4 -d float32 \
            --copies 1 || { echo "symm-bench $op on $n ranks: FAILED"; status=1; }
    done
done

PYTHON="${PYTHON:-python3}"
echo "== the Python package on npu tensors"
if [ "$BACKEND" = ascend ] && "$PYTHON" -c "import torch_npu" 2>/dev/null; then
    MATURIN_PEP517_ARGS="--features ascend" PIP_ROOT_USER_ACTION=ignore "$PYTHON" -m pip install -q ./symm-python
    for n in $(printf "%s\n" 2 "$have" | sort -un); do
        [ "$n" -ge 2 ] && [ "$n" -le "$have" ] || continue
        SYMMETRIC_MEMORY_TIMEOUT=60 timeout "$TIMEOUT" "$PYTHON" -m torch.distributed.run --nproc-per-node "$n" \
            symm-python/tests/npu_smoke.py || { echo "npu smoke on $n ranks: FAILED"; status=1; }
    done
    echo "== symm.mc2 fused against unfused on npu tensors, 2 ranks (benches/mc2_bench.py; times in us)"
    if [ "$have" -ge 2 ]; then
        SYMMETRIC_MEMORY_HEAP_SIZE=256M SYMMETRIC_MEMORY_TIMEOUT=60 timeout "$TIMEOUT" "$PYTHON" benches/mc2_bench.py \
            --device npu --ranks 2 --dtype float16 --iters 21 \
            --shapes "${ASCEND_CHECK_MC2_SHAPES:-1024x4096x4096,4096x4096x1024,4096x1024x4096}" ||
            { echo "mc2 bench on npu: FAILED"; status=1; }
    else
        echo "skipped: $have devices"
    fi
else
    echo "skipped: torch_npu does not import here (or ASCEND_CHECK_BACKEND is not ascend)"
fi

echo "== not yet on the Ascend backend (docs/ascend.md, \"Not yet\")"
echo "the conformance cases that keep buffers in host memory;"
echo "PyTorch's torch.ops.symm_mem fused operators pipelined on npu (they run the collective, then the matmul);"
echo "symm.mc2's all-gather + matmul on npu over more than 2 ranks under SYMM_VALIDATE=1 (its sends of one block overlap)."
exit $status
