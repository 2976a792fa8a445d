//! The host engine's collectives, one function per method of
//! [`Collectives`](symm_core::Collectives): a host-mapped backend's `impl Collectives` forwards
//! each method to its function here. They check the caller's arguments
//! ([`symm_core::coll::checks`]), reject what fails ([`reject`]), and run the algorithm inside
//! the engine's call (the `engine` module).

use symm_core::backend::HostMapped;
use symm_core::buffer::{LocalMut, LocalRef};
use symm_core::coll::checks::{self, Part};
use symm_core::coll::CollOptions;
use symm_core::comm::Communicator;
use symm_core::dfx::Op;
use symm_core::error::{AtRank, Result};
use symm_core::group::Group;
use symm_core::op::ReduceOp;

use crate::algo::{self, Call, Kind as K};
use crate::engine::{check_reduction, reject, run_allreduce, run_alltoall, with_ctx, with_state};
use crate::p2p;
use crate::state::CollState;
use crate::validate::Plan;

/// The host engine's [`Collectives::allreduce`](symm_core::Collectives::allreduce).
#[inline(always)]
pub fn allreduce<C: Communicator + HostMapped + ?Sized>(
    c: &C,
    group: &Group,
    mut buf: LocalMut<'_>,
    op: ReduceOp,
    opts: &CollOptions,
) -> Result<()> {
    let (len, dtype) = (buf.len(), buf.dtype());
    let p = buf.as_mut_ptr();
    // SAFETY: `buf` is valid for reads and writes of `len` elements (LocalMut contract).
    unsafe { run_allreduce(c, group, p, p, len, dtype, op, opts) }
}

/// The host engine's [`Collectives::allreduce_into`](symm_core::Collectives::allreduce_into).
#[inline(always)]
pub fn allreduce_into<C: Communicator + HostMapped + ?Sized>(
    c: &C,
    group: &Group,
    input: LocalRef<'_>,
    mut output: LocalMut<'_>,
    op: ReduceOp,
    opts: &CollOptions,
) -> Result<()> {
    let inp = Part::of_ref("input", &input);
    let out = Part::of_mut("output", &mut output);
    if let Some(e) = checks::allreduce_into(inp, out) {
        return reject(c, group, Op::AllReduce, e);
    }
    // SAFETY: both are valid for `len` elements (LocalRef/LocalMut contracts).
    unsafe { run_allreduce(c, group, input.as_ptr(), output.as_mut_ptr(), input.len(), input.dtype(), op, opts) }
}

/// The host engine's [`Collectives::reduce_scatter`](symm_core::Collectives::reduce_scatter).
#[inline(always)]
pub fn reduce_scatter<C: Communicator + HostMapped + ?Sized>(
    c: &C,
    group: &Group,
    mut output: LocalMut<'_>,
    input: LocalRef<'_>,
    op: ReduceOp,
    opts: &CollOptions,
) -> Result<()> {
    let n = group.size();
    let me = group.member().at(c.rank())?.index();
    let st = CollState::of(c, group, opts.before_blocking)?;
    let lp = match check_reduction(st, input.dtype(), op, opts) {
        Ok(lp) => lp,
        Err(e) => return reject(c, group, Op::ReduceScatter, e),
    };
    let whole = Part::of_ref("input_tensor", &input);
    let part = Part::of_mut("output_tensor", &mut output);
    if let Some(e) = checks::parts(whole, part, n, me) {
        return reject(c, group, Op::ReduceScatter, e);
    }
    let call = Call::new(K::ReduceScatter, input.dtype(), Some(op), lp, 0, output.len());
    with_state(c, group, st, opts, Plan::new(Op::ReduceScatter, input.len(), input.dtype()).of(&call), |ctx, p| {
        // SAFETY: sizes and overlap validated above; contracts of LocalRef/LocalMut.
        unsafe { algo::reduce_scatter(ctx, p, call, input.as_ptr(), output.as_mut_ptr()) }
    })
}

/// The host engine's [`Collectives::allgather`](symm_core::Collectives::allgather).
#[inline(always)]
pub fn allgather<C: Communicator + HostMapped + ?Sized>(
    c: &C,
    group: &Group,
    mut output: LocalMut<'_>,
    input: LocalRef<'_>,
    opts: &CollOptions,
) -> Result<()> {
    let n = group.size();
    let me = group.member().at(c.rank())?.index();
    let whole = Part::of_mut("output_tensor", &mut output);
    let part = Part::of_ref("input_tensor", &input);
    if let Some(e) = checks::parts(whole, part, n, me) {
        return reject(c, group, Op::AllGather, e);
    }
    let call = Call::new(K::AllGather, input.dtype(), None, None, 0, input.len());
    with_ctx(c, group, opts, Plan::new(Op::AllGather, input.len(), input.dtype()).of(&call), |ctx, p| {
        // SAFETY: validated sizes; LocalRef/LocalMut contracts.
        unsafe { algo::allgather(ctx, p, call, input.as_ptr(), output.as_mut_ptr()) }
    })
}

/// The host engine's [`Collectives::alltoall`](symm_core::Collectives::alltoall).
#[inline(always)]
pub fn alltoall<C: Communicator + HostMapped + ?Sized>(
    c: &C,
    group: &Group,
    send: &[LocalRef<'_>],
    recv: LocalMut<'_>,
    recv_counts: &[usize],
    opts: &CollOptions,
) -> Result<()> {
    let n = group.size();
    let bad = checks::alltoall_sends(send, recv.dtype(), n);
    if let Some(e) = bad {
        return reject(c, group, Op::AllToAll, e);
    }
    let (mut on_stack, mut on_heap) = ([(std::ptr::null(), 0); 8], Vec::new());
    let sends = algo::scratch(&mut on_stack, &mut on_heap, n, (std::ptr::null(), 0));
    for (piece, s) in sends.iter_mut().zip(send) {
        *piece = (s.as_ptr(), s.len());
    }
    run_alltoall(c, group, sends, recv, recv_counts, opts)
}

/// The host engine's [`Collectives::alltoall_single`](symm_core::Collectives::alltoall_single).
#[inline(always)]
pub fn alltoall_single<C: Communicator + HostMapped + ?Sized>(
    c: &C,
    group: &Group,
    send: LocalRef<'_>,
    send_counts: &[usize],
    recv: LocalMut<'_>,
    recv_counts: &[usize],
    opts: &CollOptions,
) -> Result<()> {
    let n = group.size();
    let bad = checks::alltoall_single_sends(&send, send_counts, recv.dtype(), n);
    if let Some(e) = bad {
        return reject(c, group, Op::AllToAll, e);
    }
    let size = send.dtype().size();
    let (mut on_stack, mut on_heap) = ([(std::ptr::null(), 0); 8], Vec::new());
    let sends = algo::scratch(&mut on_stack, &mut on_heap, n, (std::ptr::null(), 0));
    let mut at = 0;
    for (piece, &c) in sends.iter_mut().zip(send_counts) {
        // The prefix sums stay within `send` (checked above).
        *piece = (send.as_ptr().wrapping_add(at * size), c);
        at += c;
    }
    run_alltoall(c, group, sends, recv, recv_counts, opts)
}

/// The host engine's [`Collectives::broadcast`](symm_core::Collectives::broadcast).
#[inline(always)]
pub fn broadcast<C: Communicator + HostMapped + ?Sized>(
    c: &C,
    group: &Group,
    mut buf: LocalMut<'_>,
    root: usize,
    opts: &CollOptions,
) -> Result<()> {
    let n = group.size();
    if let Some(e) = checks::root(root, n) {
        return reject(c, group, Op::Broadcast, e);
    }
    let call = Call::new(K::Broadcast, buf.dtype(), None, None, root, buf.len());
    with_ctx(c, group, opts, Plan::new(Op::Broadcast, buf.len(), buf.dtype()).of(&call), |ctx, p| {
        // SAFETY: LocalMut contract.
        unsafe { algo::broadcast(ctx, p, call, buf.as_mut_ptr()) }
    })
}

/// The host engine's [`Collectives::send`](symm_core::Collectives::send).
#[inline(always)]
pub fn send<C: Communicator + HostMapped + ?Sized>(
    c: &C,
    group: &Group,
    buf: LocalRef<'_>,
    dst: usize,
    opts: &CollOptions,
) -> Result<()> {
    let rank = c.rank();
    group.member().at(rank)?;
    group.resolve("dst_rank", i64::try_from(dst).unwrap_or(i64::MAX)).at(rank)?;
    with_ctx(c, group, opts, Plan::new(Op::Send, buf.len(), buf.dtype()), |ctx, p| {
        // SAFETY: LocalRef contract.
        unsafe { p2p::send(ctx, p, buf.as_ptr(), buf.len() * buf.dtype().size(), buf.dtype(), dst) }
    })
}

/// The host engine's [`Collectives::recv`](symm_core::Collectives::recv).
#[inline(always)]
pub fn recv<C: Communicator + HostMapped + ?Sized>(
    c: &C,
    group: &Group,
    mut buf: LocalMut<'_>,
    src: usize,
    opts: &CollOptions,
) -> Result<()> {
    let rank = c.rank();
    group.member().at(rank)?;
    group.resolve("src_rank", i64::try_from(src).unwrap_or(i64::MAX)).at(rank)?;
    let (bytes, dtype) = (buf.len() * buf.dtype().size(), buf.dtype());
    with_ctx(c, group, opts, Plan::new(Op::Recv, buf.len(), dtype), |ctx, p| {
        // SAFETY: LocalMut contract.
        unsafe { p2p::recv(ctx, p, buf.as_mut_ptr(), bytes, dtype, src) }
    })
}

/// The host engine's [`Collectives::sendrecv`](symm_core::Collectives::sendrecv).
#[inline(always)]
pub fn sendrecv<C: Communicator + HostMapped + ?Sized>(
    c: &C,
    group: &Group,
    send: LocalRef<'_>,
    dst: usize,
    mut recv: LocalMut<'_>,
    src: usize,
    opts: &CollOptions,
) -> Result<()> {
    let rank = c.rank();
    group.member().at(rank)?;
    group.resolve("dst_rank", i64::try_from(dst).unwrap_or(i64::MAX)).at(rank)?;
    group.resolve("src_rank", i64::try_from(src).unwrap_or(i64::MAX)).at(rank)?;
    let st = CollState::of(c, group, opts.before_blocking)?;
    let (send_bytes, recv_bytes) = (send.len() * send.dtype().size(), recv.len() * recv.dtype().size());
    let (s, r) = (send.as_ptr(), recv.as_mut_ptr().cast_const());
    if let Some(e) = checks::sendrecv(s, send_bytes, r, recv_bytes) {
        return Err(e).at(rank);
    }
    // Recorded with the count and dtype of what it sends; the statistics count the bytes
    // of both directions.
    let plan = Plan { bytes: send_bytes + recv_bytes, ..Plan::new(Op::SendRecv, send.len(), send.dtype()) };
    with_state(c, group, st, opts, plan, |ctx, p| {
        // SAFETY: LocalRef/LocalMut contracts; disjoint (checked above).
        unsafe {
            p2p::sendrecv(
                ctx,
                p,
                send.as_ptr(),
                send_bytes,
                send.dtype(),
                dst,
                recv.as_mut_ptr(),
                recv_bytes,
                recv.dtype(),
                src,
            )
        }
    })
}
