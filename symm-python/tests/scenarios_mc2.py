"""MC2 fused operators (symm.mc2) on real ranks: HyperParallel's API and PyTorch's, and the
device path's ordering on CPU tensors through a test double of the stream API."""

import contextlib

import torch
import torch.distributed as dist
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import symm
import symm.mc2 as mc2
from scenarios import expect


def _gathered(x, group):
    """The group's ``x`` concatenated along dim 0, by Gloo (the unfused reference)."""
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts)


def _hp_forms(rank, group, tag, around=contextlib.nullcontext):
    """HyperParallel's forms against the unfused computation, called three times with the same
    output tensors and new data (the calls must not read what an earlier call left); each call
    inside ``around()``."""
    world = dist.get_world_size(group)
    me = dist.get_group_rank(group, rank) if group is not None else rank
    m, k, n = 12, 8, 6
    c = torch.empty(world * m, n)
    gather_out = torch.empty(world * m, k)
    signal = torch.zeros(world * 4, dtype=torch.int32)
    for call in range(3):
        a = torch.randn(m, k, generator=torch.Generator().manual_seed(10 * call + me))
        b = torch.randn(k, n, generator=torch.Generator().manual_seed(call))
        for block_size in (None, 5, m):
            with around():
                g, out = symm.mc2.fused_all_gather_matmul(a, b, c, gather_out, signal, block_size, group=group)
            assert g is gather_out and out is c
            want = _gathered(a, group)
            assert torch.equal(gather_out, want), f"{tag}: gather_out, call {call}"
            assert torch.allclose(c, want @ b, atol=1e-5), f"{tag}: c, call {call} block {block_size}"
        x1 = torch.randn(world * m, k, generator=torch.Generator().manual_seed(100 * call + me))
        for op in ("sum", "avg"):
            for block_size in (None, 5):
                with around():
                    got = symm.mc2.fused_matmul_reduce_scatter(x1, b, None, signal, op, block_size, group=group)
                total = sum(torch.tensor_split(_gathered((x1 @ b).unsqueeze(0), group), world))[0]
                want = (total / world if op == "avg" else total)[me * m : (me + 1) * m]
                assert torch.allclose(got, want, atol=1e-4), f"{tag}: matmul + reduce_scatter {op}, call {call}"
    assert torch.equal(signal, torch.zeros_like(signal)), "signal is not written"


def hyperparallel_api(rank, world):
    _hp_forms(rank, None, "world")
    # A sub-group: the first two ranks (the others pass).
    sub = symm.create_group([1, 0])
    if rank in (0, 1):
        _hp_forms(rank, sub, "group [1, 0]")
    # 16-bit inputs reduce in float32 in group-rank order: every rank's rows are those of an
    # allreduce of the products.
    x1 = torch.randn(world * 4, 16, generator=torch.Generator().manual_seed(rank)).to(torch.bfloat16)
    x2 = torch.randn(16, 8, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    got = symm.mc2.fused_matmul_reduce_scatter(x1, x2)
    full = x1 @ x2
    symm.shmem_allreduce(full, "sum")
    assert torch.equal(got, full[rank * 4 : (rank + 1) * 4]), "bf16 rows equal those of an allreduce"

    inv = symm.InvalidArgument
    a, b = torch.randn(4, 3), torch.randn(3, 2)
    c, g = torch.empty(world * 4, 2), torch.empty(world * 4, 3)
    f = symm.mc2.fused_all_gather_matmul
    expect(inv, lambda: f(a, torch.randn(4, 2), c, g), "b", "expected 3 rows", rank=rank)
    expect(inv, lambda: f(a, b, torch.empty(4, 2), g), "c", "contiguous", rank=rank)
    expect(inv, lambda: f(a, b, c, g.t()), "gather_out", rank=rank)
    expect(inv, lambda: f(a, b.double(), c, g), "b", "float64", rank=rank)
    # Every operand on the first one's device, which is the CPU or an npu.
    expect(inv, lambda: f(a, b.to("meta"), c, g), "b", "on meta", "expected a tensor on cpu (a's device", rank=rank)
    expect(inv, lambda: f(a.to("meta"), b, c, g), "a", "on meta", "expected a tensor on cpu or npu", rank=rank)
    expect(inv, lambda: f(a, b, c, g, torch.zeros(4)), "signal", "int32", rank=rank)
    expect(inv, lambda: f(a, b, c, g, None, 0), "block_size", rank=rank)
    expect(inv, lambda: f(a.view(-1), b, c, g), "a", "2-D", rank=rank)
    r = symm.mc2.fused_matmul_reduce_scatter
    expect(inv, lambda: r(torch.randn(world * 2 + 1, 3), b), "x1", "multiple of the group's size", rank=rank)
    expect(inv, lambda: r(torch.randn(world * 2, 3), b, reduce_op="max"), "reduce_op", rank=rank)
    expect(inv, lambda: r(torch.randn(world * 2, 3), b.to("meta")), "x2", "on meta", "(x1's device", rank=rank)
    # After refusals (their peers' rounds rejected), the group still works.
    fused = symm.mc2.fused_matmul_reduce_scatter(torch.ones(world * 2, 3), torch.ones(3, 2))
    assert torch.equal(fused, torch.full((2, 2), 3.0 * world))
    symm.barrier()


def _torch_unfused_ag(A_shard, Bs, gather_dim, group):
    parts = [torch.empty_like(A_shard) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, A_shard.contiguous(), group=group)
    A = torch.cat(parts, dim=gather_dim)
    return A, [A @ B for B in Bs]


def torch_ops(rank, world):
    """PyTorch's ``symm_mem`` operators on CPU, as PyTorch's AsyncTPTest checks them."""
    mc2.register_torch_ops()
    group = dist.group.WORLD
    name = group.group_name
    torch.manual_seed(42 + rank)
    for gather_dim in (0, 1, 2):
        full = [8, 64, 32]
        full[gather_dim] //= world
        A_shard = torch.rand(full)
        Bs = [torch.rand(32, 16) for _ in range(3)]
        # Every rank multiplies by the same Bs.
        for B in Bs:
            dist.broadcast(B, 0)
        A, outs = torch.ops.symm_mem.fused_all_gather_matmul(A_shard, Bs, gather_dim, name)
        A_ref, outs_ref = _torch_unfused_ag(A_shard, Bs, gather_dim, group)
        assert torch.equal(A, A_ref) and A.stride() == A_ref.stride(), f"A_gathered, gather_dim {gather_dim}"
        for o, r in zip(outs, outs_ref):
            assert torch.allclose(o, r) and o.stride() == r.stride(), f"outputs, gather_dim {gather_dim}"
        none, _ = torch.ops.symm_mem.fused_all_gather_matmul(A_shard, Bs, gather_dim, name, return_A=False)
        assert none is None
    A = torch.rand(8, 64, 1024)
    B = torch.rand(1024, 16)
    dist.broadcast(B, 0)
    for scatter_dim in (0, 1, 2):
        if (A @ B).shape[scatter_dim] % world:
            continue
        out = torch.ops.symm_mem.fused_matmul_reduce_scatter(A, B, "avg", scatter_dim, name)
        product = A @ B
        total = product.clone()
        dist.all_reduce(total)
        want = torch.tensor_split(total / world, world, dim=scatter_dim)[rank].contiguous()
        assert torch.allclose(out, want, atol=1e-3), f"matmul + reduce_scatter, scatter_dim {scatter_dim}"
        assert out.stride() == want.stride(), (out.stride(), want.stride())

    # The kernels refuse operands on another device than A's, by name (called directly: the
    # dispatcher sends a call with a meta tensor to PyTorch's meta kernel).
    inv = symm.InvalidArgument
    meta = B.to("meta")
    expect(inv, lambda: mc2._torch_all_gather_matmul(A[0], [B, meta], 0, name), "Bs[1]", "on meta", "(A's", rank=rank)
    expect(inv, lambda: mc2._torch_matmul_reduce_scatter(A, meta, "sum", 0, name), "B", "on meta", rank=rank)

    # Under torch.compile: the graph keeps the operator (PyTorch's meta kernel traces it).
    def step(a, bs):
        return torch.ops.symm_mem.fused_all_gather_matmul(a, bs, 0, name)[1][0].sum()

    A_shard = torch.rand(4, 32)
    B = torch.rand(32, 8)
    dist.broadcast(B, 0)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    assert torch.allclose(compiled(A_shard, [B]), step(A_shard, [B])), "compiled result"
    symm.barrier()


class Replicated(torch.autograd.Function):
    """A parameter every rank holds the same copy of: its gradient is the sum of every rank's
    (what DDP's all-reduce makes of it), by Gloo."""

    @staticmethod
    def forward(ctx, b):
        return b.view_as(b)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous().clone()
        dist.all_reduce(g)
        return g


def gradients(rank, world):
    """gradcheck in float64 through both HyperParallel forms, as scenarios_autograd.py does it:
    every rank runs the same global function of the same inputs (its rows handed out by
    Scatter, the outputs stacked by Gather, a replicated ``b``'s gradient summed)."""
    from scenarios_autograd import Gather, Scatter, global_input

    group = dist.group.WORLD
    m, k, n = 2, 3, 2
    X = global_input(world, m, k)
    b = global_input(1, k, n, seed=1)[0].detach().requires_grad_()

    def ag(X, b):
        c = torch.empty(world * m, n, dtype=torch.float64)
        g = torch.empty(world * m, k, dtype=torch.float64)
        gathered, c = symm.mc2.fused_all_gather_matmul(Scatter.apply(X, group), Replicated.apply(b), c, g, block_size=1)
        return Gather.apply(gathered, group), Gather.apply(c, group)

    assert torch.autograd.gradcheck(ag, (X, b), eps=1e-6, atol=1e-7, rtol=1e-5), "all-gather + matmul"
    X1 = global_input(world, world * m, k, seed=2)
    for op in ("sum", "avg"):

        def mr(X1, b, op=op):
            x1 = Scatter.apply(X1, group)
            out = symm.mc2.fused_matmul_reduce_scatter(x1, Replicated.apply(b), reduce_op=op, block_size=1)
            return Gather.apply(out, group)

        assert torch.autograd.gradcheck(mr, (X1, b), eps=1e-6, atol=1e-7, rtol=1e-5), f"matmul + reduce_scatter ({op})"
    # Without grad mode, nothing is recorded.
    with torch.no_grad():
        c = torch.empty(world * m, n, dtype=torch.float64)
        _, c = symm.mc2.fused_all_gather_matmul(X[rank], b, c, torch.empty(world * m, k, dtype=torch.float64))
    assert c.grad_fn is None
    symm.barrier()


# --------------------------------------------------------------------------------------------
# The device path's ordering (mc2._StreamOrder) on CPU tensors, through a test double
# --------------------------------------------------------------------------------------------


def _extent(t):
    """The bytes ``[lo, hi)`` a CPU tensor's elements span."""
    if t.numel() == 0:
        return (0, 0)
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return (t.data_ptr(), t.data_ptr() + span * t.element_size())


def _overlap(x, y):
    return x[0] < y[1] and y[0] < x[1]


class _Stream:
    """A stream of the double, with torch's stream methods."""

    def __init__(self, double, name):
        self.double, self.name = double, name

    def wait_stream(self, other):
        self.double.wait_stream(self, other)

    def record_event(self):
        return self.double.record(self)

    def wait_event(self, event):
        self.double.wait_event(self, event)


class StreamDouble(TorchDispatchMode):
    """A test double of a device's stream API (the platform's ``caller_stream``, ``side_stream``
    and ``using_stream``; the streams' ``wait_stream``, ``record_event`` and ``wait_event``), so
    that symm.mc2's device path runs on CPU tensors. It tests our ordering logic: it is no
    evidence that a device runs the path right (scripts/ascend-check.sh runs it on npu tensors).

    It emulates a device whose caller's stream runs each torch operation when issued (the host)
    and whose side stream runs symm's asynchronous exchanges (symm's progress thread): waiting
    for an event or a stream waits on the host for the exchanges it covers, so a missing wait
    leaves a real race. It logs the stream calls, the exchanges and the matmuls (``log``), and
    records in ``violations`` every breach of a device's rules:

    - an operation of the caller's stream reads or writes memory an exchange receives into, or
      writes memory it sends from (while symm holds it), before the stream has waited for that
      exchange;
    - an exchange sends from memory the caller's stream wrote, or receives into memory it used,
      after the side stream last waited for the caller's stream;
    - an exchange is not an asynchronous call issued on the side stream.

    ``drop``: stream calls it ignores ("ready": the caller's stream waiting for an event;
    "inputs": the side stream waiting for the caller's), to show that the checks catch them.
    """

    def __init__(self, real_sendrecv, drop=()):
        super().__init__()
        self.real_sendrecv, self.drop = real_sendrecv, drop
        self.current, self.side = _Stream(self, "current"), _Stream(self, "side")
        self.active = self.current
        self.log, self.violations = [], []
        self.exchanges = []  # [send extent, receive extent, work, joined by the caller's stream]
        self.ops = []  # (number, extents written, extents used) of the caller's stream's operations
        self.side_saw = 0  # the caller's operations the side stream waited for
        self.events = 0
        self.inside = False

    # -- the platform's part ----------------------------------------------------------------
    def caller_stream(self, device):
        return self.current

    def side_stream(self, device):
        return self.side

    @contextlib.contextmanager
    def using_stream(self, stream):
        before, self.active = self.active, stream
        try:
            yield
        finally:
            self.active = before

    # -- the streams' part ------------------------------------------------------------------
    def wait_stream(self, waiter, other):
        self.log.append(f"{waiter.name} waits {other.name}")
        if (waiter, other) == (self.side, self.current) and "inputs" not in self.drop:
            self.side_saw = len(self.ops)
        elif (waiter, other) == (self.current, self.side):
            self._join(self.exchanges)

    def record(self, stream):
        if stream is not self.side:
            self.violations.append(f"an event recorded on the {stream.name} stream")
        event = (self.events, len(self.exchanges))
        self.log.append(f"record e{self.events}")
        self.events += 1
        return event

    def wait_event(self, stream, event):
        number, upto = event
        self.log.append(f"{stream.name} waits e{number}")
        if stream is self.current and "ready" not in self.drop:
            self._join(self.exchanges[:upto])

    def _join(self, exchanges):
        for x in exchanges:
            if not x[3]:
                x[2].wait()
                x[3] = True

    # -- symm's exchanges and torch's operations ----------------------------------------------
    def sendrecv(self, send, dst, recv, src, group=None, async_op=False):
        if self.active is not self.side or not async_op:
            self.violations.append(f"an exchange on the {self.active.name} stream, async_op={async_op}")
        s, r = _extent(send), _extent(recv)
        for number, writes, used in self.ops[self.side_saw :]:
            if any(_overlap(w, s) for w in writes) or any(_overlap(u, r) for u in used):
                self.violations.append(f"exchange {len(self.exchanges)} before the side stream saw operation {number}")
        self.log.append("exchange")
        self.inside = True
        try:
            work = self.real_sendrecv(send, dst, recv, src, group=group, async_op=True)
        finally:
            self.inside = False
        self.exchanges.append([s, r, work, False])
        return work

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.inside and not func.is_view:
            named = dict(zip((a.name for a in func._schema.arguments), args), **kwargs)
            written = [a.name for a in func._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
            writes = [_extent(named[w]) for w in written if isinstance(named.get(w), torch.Tensor)]
            used = [_extent(t) for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            number = len(self.ops)
            for i, (s, r, work, joined) in enumerate(self.exchanges):
                # Once symm has seen an exchange complete it releases its tensors, and the
                # allocator may hand their memory out again: a write there is then no breach.
                uses_received = any(_overlap(u, r) for u in used)
                overwrites_sent = any(_overlap(w, s) for w in writes) and not work.is_completed()
                if not joined and (uses_received or overwrites_sent):
                    self.violations.append(f"{func} (operation {number}) before waiting for exchange {i}")
            self.ops.append((number, writes, used))
            if func.overloadpacket is torch.ops.aten.mm:
                self.log.append("mm")
        return func(*args, **kwargs)


@contextlib.contextmanager
def _on_double(drop=()):
    """Runs symm.mc2's CPU calls inside on its device path over a ``StreamDouble`` (yielded)."""
    double = StreamDouble(mc2.shmem_sendrecv, drop)
    saved = mc2._device_streams, mc2.shmem_sendrecv
    mc2._device_streams, mc2.shmem_sendrecv = (lambda device: double), double.sendrecv
    try:
        with double:
            yield double
    finally:
        mc2._device_streams, mc2.shmem_sendrecv = saved


@contextlib.contextmanager
def _checked():
    with _on_double() as double:
        yield
    assert not double.violations, double.violations
    assert double.log[-1] == "current waits side", double.log


def device_path_on_a_double(rank, world):
    """The device path (a side stream for the exchanges, events, the caller's stream for the
    compute) on CPU tensors over ``StreamDouble``: the results of the unfused computation, the
    device's ordering rules kept, the order of the stream calls as designed, and breaches of
    those rules caught by the double."""
    # HyperParallel's forms, repeated with the same tensors, every block size (None: the
    # device's default, pipelined), against the unfused computation.
    _hp_forms(rank, None, "device path", around=_checked)
    # 16-bit inputs: reduced in float32 in group-rank order, as an allreduce of the products.
    x1 = torch.randn(world * 4, 16, generator=torch.Generator().manual_seed(rank)).to(torch.bfloat16)
    x2 = torch.randn(16, 8, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    with _checked():
        got = symm.mc2.fused_matmul_reduce_scatter(x1, x2)
    full = x1 @ x2
    symm.shmem_allreduce(full, "sum")
    assert torch.equal(got, full[rank * 4 : (rank + 1) * 4]), "bf16 rows equal those of an allreduce"

    # The order of the stream calls: 3 blocks of each peer's 12 rows.
    m, k, n = 12, 8, 6
    steps = 3 * (world - 1)
    a, b = torch.randn(m, k), torch.randn(k, n)
    c, g = torch.empty(world * m, n), torch.empty(world * m, k)
    with _on_double() as d:
        symm.mc2.fused_all_gather_matmul(a, b, c, g, block_size=5)
    want = ["side waits current", "exchange", "record e0", "mm"]
    for i in range(1, steps + 1):
        want += [f"current waits e{i - 1}"] + (["exchange", f"record e{i}"] if i < steps else []) + ["mm"]
    assert d.log == want + ["current waits side"], d.log
    assert not d.violations, d.violations
    x1 = torch.randn(world * m, k)
    with _on_double() as d:
        symm.mc2.fused_matmul_reduce_scatter(x1, b, block_size=5)
    want = [e for i in range(steps) for e in ("mm", "side waits current", "exchange", f"record e{i}")]
    want += ["mm"] + [f"current waits e{i}" for i in range(steps)] + ["current waits side"]
    assert d.log == want, d.log
    assert not d.violations, d.violations

    # Without those waits, the double reports the breaches (and the caller's stream's final wait
    # for the side stream leaves nothing in flight).
    with _on_double(drop=("ready",)) as d:
        symm.mc2.fused_all_gather_matmul(a, b, c, g, block_size=5)
    assert any("aten.mm.out" in v and "before waiting for exchange" in v for v in d.violations), d.violations
    with _on_double(drop=("inputs",)) as d:
        symm.mc2.fused_matmul_reduce_scatter(x1, b, block_size=5)
    assert any("before the side stream saw" in v for v in d.violations), d.violations

    # An exchange that failed after its call returned is reported by the next call on the
    # device, which rejects the group's next collective (here every rank's).
    class Failed:
        def is_completed(self):
            raise RuntimeError("exchange failed on the side stream")

    mc2._unsettled.setdefault(torch.device("cpu"), []).insert(0, Failed())
    try:
        with _on_double():
            symm.mc2.fused_all_gather_matmul(a, b, c, g)
        raise AssertionError("the earlier failure was not reported")
    except RuntimeError as e:
        assert "exchange failed on the side stream" in str(e), e
    assert not mc2._unsettled[torch.device("cpu")], "the failed call's works are forgotten"
    with _checked():
        symm.mc2.fused_all_gather_matmul(a, b, c, g)
    assert torch.equal(g, _gathered(a, None)), "the group works after the reported failure"
    symm.barrier()
