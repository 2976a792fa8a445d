"""The Python package on npu tensors, for an Ascend node (scripts/ascend-check.sh runs it under
torchrun, one process per device, with a build that has the Ascend backend). Not collected by
pytest: it needs torch_npu, CANN and devices, which the CI machines do not have.

Each rank checks, against values it computes itself: a symmetric npu tensor from
``symm.empty``, written by an npu kernel and put to its right neighbour with a signal on the
current stream; allreduce, allgather and broadcast of ordinary npu tensors; an asynchronous
allreduce; allreduce in every low-precision format, bit for bit the CPU backend's; a side
stream ordered after symm's work by ``stream_event``, and HCCL's all-gather after symm's
allreduce; the MC2 fused operators (``mc2_checks``); the heap's use; ``free``. Exits non-zero,
naming the check, when one fails.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch_npu  # noqa: F401 - registers torch.npu

import symm


def main() -> None:
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.npu.set_device(local)
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    npu = torch.device("npu", local)

    # A symmetric tensor written by an npu kernel, put to the right with a signal, on the
    # current stream: the put follows the fill, the wait precedes the read.
    land = symm.empty(1024, torch.float32, device="npu")
    src = symm.empty(1024, torch.float32, device="npu")
    sig = symm.empty(1, torch.int32, device="npu")
    assert land.device.type == "npu" and symm.is_symmetric(land), "symm.empty(device='npu')"
    sig.zero_()
    src.fill_(float(rank + 1))
    symm.barrier()
    symm.shmem_put_with_signal(land, 0, src, 0, 1024, sig, 0, 1, 0, right)
    assert symm.shmem_wait_for_signal(None, sig, 0, 1, "eq") == 1, "wait_for_signal"
    got = land.cpu()
    assert torch.equal(got, torch.full((1024,), float(left + 1))), f"put_with_signal: {got[:4]}"

    # Collectives on ordinary npu tensors (staged through the heap).
    total = n * (n + 1) / 2
    x = torch.full((4099,), float(rank + 1), device=npu)
    symm.shmem_allreduce(x, "sum")
    assert torch.equal(x.cpu(), torch.full((4099,), total)), "allreduce"
    out = torch.empty(n * 33, dtype=torch.bfloat16, device=npu)
    symm.shmem_allgather(out, torch.full((33,), float(rank), dtype=torch.bfloat16, device=npu))
    want = torch.arange(n, dtype=torch.bfloat16).repeat_interleave(33)
    assert torch.equal(out.cpu(), want), "allgather"
    b = torch.full((77,), float(rank), dtype=torch.float16, device=npu)
    symm.shmem_broadcast(b, n - 1)
    assert torch.equal(b.cpu(), torch.full((77,), float(n - 1), dtype=torch.float16)), "broadcast"
    y = torch.full((1 << 20,), 0.5, device=npu)
    work = symm.shmem_allreduce(y, "avg", async_op=True)
    work.wait()
    assert torch.equal(y.cpu(), torch.full((1 << 20,), 0.5)), "async allreduce (avg)"

    # Low-precision transport: the device codec gives the CPU codec's bytes (docs/accuracy.md),
    # here against the CPU backend on the same values; blocks of tiny values take the host's path.
    g = torch.Generator().manual_seed(rank)
    values = torch.randn(5 * 256 + 77, generator=g) * 100
    values[256:512] *= 1e-42
    for fmt in (torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2):
        for op in ("sum", "max", "avg"):
            on_cpu = values.clone()
            symm.shmem_allreduce(on_cpu, op, low_precision_dtype=fmt)
            on_npu = values.to(npu)
            symm.shmem_allreduce(on_npu, op, low_precision_dtype=fmt)
            same = torch.equal(on_npu.cpu().view(torch.int32), on_cpu.view(torch.int32))
            assert same, f"allreduce via {fmt} ({op}): the npu's bytes differ from the CPU's"

    # Interop: a consumer on a side stream waits for symm's asynchronous allreduce through
    # stream_event, without the host waiting; HCCL's process group then gathers the result (it
    # orders its streams after the current one by itself).
    z = torch.full((4096,), float(rank + 1), device=npu)
    work = symm.shmem_allreduce(z, "sum", async_op=True)
    ready = symm.stream_event()
    side = torch.npu.Stream()
    side.wait_event(ready)
    with torch.npu.stream(side):
        doubled = z * 2
    torch.npu.current_stream().wait_stream(side)
    work.wait()
    assert torch.equal(doubled.cpu(), torch.full((4096,), 2 * total)), "stream_event"
    hccl = dist.new_group(backend="hccl")
    gathered = [torch.empty_like(z) for _ in range(n)]
    dist.all_gather(gathered, z, group=hccl)
    assert all(torch.equal(g.cpu(), torch.full((4096,), total)) for g in gathered), "HCCL after symm"

    mc2_checks(rank, n, npu)

    stats = symm.memory_stats(device="npu")
    assert stats["in_use"] >= 3 * 4096, f"memory_stats(device='npu'): {stats}"
    symm.barrier()
    for t in (land, src, sig):
        symm.free(t)
    print(f"npu smoke: rank {rank} of {n} passed", flush=True)
    dist.destroy_process_group()


#: The MC2 checks' tolerance per dtype: float32 as the CPU tests of symm.mc2, the 16-bit ones as
#: the CPU tests of the low-precision collectives.
MC2_TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 2e-2}


def _rows(rank: int, call: int, rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """A rank's inputs of a call, on the CPU: any rank makes any rank's, for the references."""
    g = torch.Generator().manual_seed(1000 * call + rank)
    return (torch.randn(rows, cols, generator=g) / 8).to(dtype)


def mc2_checks(rank: int, n: int, npu: torch.device) -> None:
    """symm.mc2 on npu tensors against the unfused computation on CPU copies, in float32: both
    HyperParallel forms, pipelined (the device's default: exchanges on a side stream) with two
    block sizes, three calls with the same tensors and new data, in every dtype; their backward;
    PyTorch's operators (torch.ops.symm_mem) where symm's kernels serve npu tensors."""
    m, k, cols = 64, 128, 48
    for dtype, tol in MC2_TOLERANCE.items():
        a = torch.empty(m, k, dtype=dtype, device=npu)
        b = torch.empty(k, cols, dtype=dtype, device=npu)
        x1 = torch.empty(n * m, k, dtype=dtype, device=npu)
        c = torch.empty(n * m, cols, dtype=dtype, device=npu)
        g = torch.empty(n * m, k, dtype=dtype, device=npu)
        for call in range(3):
            a.copy_(_rows(rank, call, m, k, dtype))
            b.copy_(_rows(n, call, k, cols, dtype))
            x1.copy_(_rows(rank, 10 + call, n * m, k, dtype))
            gathered = torch.cat([_rows(r, call, m, k, dtype) for r in range(n)])
            weights = b.cpu().float()
            total = sum(_rows(r, 10 + call, n * m, k, dtype).float() @ weights for r in range(n))
            for block_size in (None, 16):
                tag = f"{dtype}, call {call}, block_size {block_size}"
                got_g, got_c = symm.fused_all_gather_matmul(a, b, c, g, None, block_size)
                assert got_g is g and got_c is c, f"fused_all_gather_matmul returns its outputs ({tag})"
                assert torch.equal(g.cpu(), gathered), f"fused_all_gather_matmul: gather_out ({tag})"
                want = gathered.float() @ weights
                assert torch.allclose(c.cpu().float(), want, rtol=tol, atol=tol), f"fused_all_gather_matmul: c ({tag})"
                for op in ("sum", "avg"):
                    out = symm.fused_matmul_reduce_scatter(x1, b, None, None, op, block_size)
                    want = (total / n if op == "avg" else total)[rank * m : (rank + 1) * m]
                    close = torch.allclose(out.cpu().float(), want, rtol=tol, atol=tol)
                    assert close, f"fused_matmul_reduce_scatter ({op}, {tag})"

    # The backward, float32: every rank's loss is the sum of its outputs.
    a = _rows(rank, 7, m, k, torch.float32).to(npu).requires_grad_()
    b = _rows(n, 7, k, cols, torch.float32).to(npu).requires_grad_()
    c = torch.empty(n * m, cols, device=npu)
    g = torch.empty(n * m, k, device=npu)
    _, out = symm.fused_all_gather_matmul(a, b, c, g)
    out.sum().backward()
    ones = torch.ones(n * m, cols)
    weights, gathered = b.detach().cpu(), torch.cat([_rows(r, 7, m, k, torch.float32) for r in range(n)])
    tol = MC2_TOLERANCE[torch.float32]
    assert torch.allclose(a.grad.cpu(), n * ones[:m] @ weights.t(), rtol=tol, atol=tol), "all-gather + matmul: grad_a"
    assert torch.allclose(b.grad.cpu(), gathered.t() @ ones, rtol=tol, atol=tol), "all-gather + matmul: grad_b"
    x1 = _rows(rank, 8, n * m, k, torch.float32).to(npu).requires_grad_()
    b.grad = None
    symm.fused_matmul_reduce_scatter(x1, b).sum().backward()
    assert torch.allclose(x1.grad.cpu(), ones @ weights.t(), rtol=tol, atol=tol), "matmul + reduce-scatter: grad_x1"
    want = x1.detach().cpu().t() @ ones
    assert torch.allclose(b.grad.cpu(), want, rtol=tol, atol=tol), "matmul + reduce-scatter: grad_x2"

    # PyTorch's operators: symm's kernels where torch_npu has none of its own (symm.mc2).
    import symm.mc2 as mc2

    if ("fused_all_gather_matmul", "PrivateUse1") not in mc2._registered:
        print(f"rank {rank}: torch.ops.symm_mem on npu: torch_npu's own kernels serve them, not checked here")
        return
    name = dist.group.WORLD.group_name
    shard = _rows(rank, 9, m, k, torch.float32)
    gathered = torch.cat([_rows(r, 9, m, k, torch.float32) for r in range(n)])
    A, outs = torch.ops.symm_mem.fused_all_gather_matmul(shard.to(npu), [b.detach()], 0, name)
    assert torch.equal(A.cpu(), gathered), "torch.ops.symm_mem.fused_all_gather_matmul: A_gathered"
    assert torch.allclose(outs[0].cpu(), gathered @ weights, rtol=tol, atol=tol), "torch.ops ... all_gather_matmul"
    out = torch.ops.symm_mem.fused_matmul_reduce_scatter(gathered.to(npu), b.detach(), "avg", 0, name)
    want = (gathered @ weights)[rank * m : (rank + 1) * m]  # every rank's A is the same: avg = one
    assert torch.allclose(out.cpu(), want, rtol=tol, atol=tol), "torch.ops.symm_mem.fused_matmul_reduce_scatter"


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"npu smoke FAILED on rank {os.environ.get('RANK', '?')}: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
