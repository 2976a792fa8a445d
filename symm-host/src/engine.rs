//! What every call of the host engine does around its algorithm: look up the group's state,
//! number and record the call, refuse a second thread, run the validation round, and leave the
//! group out of step after a call that failed mid-round.

use std::sync::atomic::Ordering;

use symm_core::backend::HostMapped;
use symm_core::buffer::LocalMut;
use symm_core::coll::checks::{self, Part};
use symm_core::coll::CollOptions;
use symm_core::comm::Communicator;
use symm_core::dfx::{self, Op};
use symm_core::dtype::DType;
use symm_core::error::{ArgError, AtRank, Error, Result};
use symm_core::group::Group;
use symm_core::op::ReduceOp;

use crate::algo::{self, Call, Kind as K};
use crate::state::{self, CollState, Ctx};
use crate::try_lock;
use crate::validate::{self, Plan};
use crate::wait;

/// Collective over `group`: sets up the group's collective workspace now rather than at its
/// first collective. Backends call it for the world at start-up, so that send/recv between two
/// ranks of the world never needs the other ranks; call it for a sub-group whose first use is
/// a send/recv between some of its members.
pub fn prepare<C: Communicator + HostMapped + ?Sized>(c: &C, group: &Group) -> Result<()> {
    group.member().at(c.rank())?;
    CollState::of(c, group, None).map(|_| ())
}

/// Checks op/dtype/format of a reduction; returns the transport format in effect
/// ([`checks::transport_format`]).
pub(crate) fn check_reduction(
    st: &CollState,
    dtype: DType,
    op: ReduceOp,
    opts: &CollOptions,
) -> std::result::Result<Option<DType>, ArgError> {
    checks::reduction(&st.tun.default_low_precision, dtype, op, opts.transport)
}

/// Runs `f` as one call of `plan.op` with the group's collective state held: numbers the call,
/// records it (flight recorder, statistics, log), runs the validation round in validation mode,
/// and refuses a second thread driving the same group at the same time.
#[inline(always)]
pub(crate) fn with_ctx<C: Communicator + HostMapped + ?Sized, T>(
    c: &C,
    group: &Group,
    opts: &CollOptions,
    plan: Plan<'_>,
    f: impl FnOnce(&Ctx<'_, C>, &mut state::Progress) -> Result<T>,
) -> Result<T> {
    group.member().at(c.rank())?;
    with_state(c, group, CollState::of(c, group, opts.before_blocking)?, opts, plan, f)
}

/// [`with_ctx`] with the group's collective state already looked up (the caller is a member).
/// Always inlined into the collective's entry, so that what the entry knows (the operation,
/// point-to-point or not) folds into it: as a function of its own it cost small calls 40-240
/// instructions (callgrind, 2 ranks, sendrecv, broadcast and reduce_scatter at 8 bytes).
#[inline(always)]
pub(crate) fn with_state<C: Communicator + HostMapped + ?Sized, T>(
    c: &C,
    group: &Group,
    st: &CollState,
    opts: &CollOptions,
    plan: Plan<'_>,
    f: impl FnOnce(&Ctx<'_, C>, &mut state::Progress) -> Result<T>,
) -> Result<T> {
    c.check_process()?;
    let rank = c.rank();
    group.settle_streams(rank, plan.op.name(), opts.timeout.unwrap_or(c.default_timeout()))?;
    let p2p = matches!(plan.op, Op::Send | Op::Recv | Op::SendRecv);
    let mut ev = dfx::OpEvent {
        op: plan.op,
        group: Some(group),
        seq: 0,
        count: plan.count as u64,
        dtype: plan.dtype,
        bytes: plan.bytes as u64,
    };
    let mut progress = match st.progress.try_lock() {
        Ok(p) => p,
        Err(try_lock::Taken::Busy) => {
            // Relaxed: a hint for the message; the holder may have moved on since.
            let busy = st.busy.load(Ordering::Relaxed);
            let busy = match Op::from_code((busy & 0xff) as u8) {
                Some(op) => format!("it is in {} #{}", op.name(), busy >> 8),
                None => "it is setting up".into(),
            };
            let e = Error::ConcurrentUse { rank, op: plan.op.name().into(), group: group.ranks().to_vec(), busy };
            dfx::refused(c, &ev, &e);
            return Err(e);
        }
        // A poisoned lock means a panic mid-call; the round numbers may be off, so refuse.
        Err(try_lock::Taken::Poisoned) => {
            return Err(Error::InvalidArgument {
                rank,
                source: ArgError::invalid(
                    "group",
                    format!("{group:?}"),
                    "a previous collective panicked in this group",
                ),
            })
        }
    };
    // A call that rejects its own arguments still runs (`reject` then skips its round): its
    // error says more than this one.
    if let (false, false, Some(why)) = (p2p, plan.rejected, &progress.out_of_step) {
        let e = Error::InvalidArgument { rank, source: ArgError::invalid("group", format!("{group:?}"), why.clone()) };
        dfx::refused(c, &ev, &e);
        return Err(e);
    }
    let call = if p2p {
        progress.p2p_calls += 1;
        progress.p2p_calls
    } else {
        progress.colls += 1;
        progress.colls
    };
    // Relaxed: read only for the message of a thread that finds the lock taken.
    st.busy.store(u64::from(plan.op.code()) | (call << 8), Ordering::Relaxed);
    let mut ctx = Ctx::new(c, group, st, opts.timeout.unwrap_or(c.default_timeout()), plan.op.name());
    (ctx.call, ctx.p2p, ev.seq) = (call, p2p, call);
    ctx.before_blocking = opts.before_blocking;
    (ctx.bcasts, ctx.last_bcast) = (progress.bcasts, progress.last_bcast);
    // A small broadcast's own waits judge the peers' small-broadcast slots (see `eager`).
    let small_bcast = plan.op == Op::Broadcast && plan.bytes <= st.eager_max;
    ctx.watch_eager = !p2p && !plan.rejected && !small_bcast;
    let started = dfx::start(c, &ev);
    ctx.record = started;
    let validate = st.tun.validate && !p2p;
    // What peers published since this member's last call (see `wait`): a small broadcast's
    // root, which never waits, learns there that its members disagree.
    let news = if p2p || plan.rejected { None } else { ctx.news_at_entry().map(|e| ctx.diverge(e)) };
    let checked = match news {
        Some(e) => Err(e),
        None if validate => validate::round(&ctx, &mut progress, &plan),
        None => Ok(()),
    };
    let mut r = match checked {
        Ok(()) => f(&ctx, &mut progress),
        Err(e) => Err(e),
    };
    if let (true, Err(e)) = (validate, &mut r) {
        validate::annotate(&ctx, e);
    }
    let collective = !p2p && !st.tun.validate;
    // (A call that found the members out of step is handled below, whatever its error.)
    let diverged = ctx.diverged.get();
    if let (true, false, Err(e @ (Error::Timeout(_) | Error::PeerLost { .. } | Error::PeerExited { .. }))) =
        (collective, diverged, &r)
    {
        // This member left the call mid-round; a member still in it would pair its rounds with
        // this member's next collective (a multi-round call then mixes two calls' data), so the
        // group takes no more collectives here. In validation mode the next call's validation
        // round compares call numbers instead, and reports the skew on every member.
        progress.out_of_step = Some(format!(
            "its members are out of step since {} #{call} failed on this rank ({}): a late member would \
             pair later collectives with the wrong calls, so this group takes no more collectives \
             (point-to-point calls, the heap and other groups still work; SYMM_VALIDATE=1 checks every \
             collective's call number instead)",
            plan.op.name(),
            e.code()
        ));
        // A peer still waiting for this member's part would wait out its own timeout: told
        // now. (A lost or exited peer is seen by every member itself.)
        if let Error::Timeout(_) = e {
            ctx.publish_failure(plan.op, wait::FAILED_TIMEOUT);
        }
    }
    if let (true, Err(e)) = (diverged, &r) {
        // The members are out of step (a peer in another call): whichever way this member
        // went on, its rounds would pair with the wrong calls. Every peer learns it at its next
        // wait on this member or its next collective of the group.
        progress.out_of_step = Some(format!(
            "its members are out of step since {} #{call} found a peer in another collective call or gone from \
             the group's collectives ({}): this group takes no more collectives (point-to-point calls, the heap \
             and other groups still work)",
            plan.op.name(),
            e.code()
        ));
        ctx.publish_failure(plan.op, wait::FAILED_OUT_OF_STEP);
    }
    dfx::finish(c, &ev, started, &mut r);
    r
}

/// Fails this member's next collective call of `group` (recorded as `op`) with the argument
/// error `e`, found by the caller before it could make the call (a language binding's own
/// checks): takes part in the call's round only to reject it, so that the members waiting in
/// their collective fail at once with [`Error::PeerRejected`] instead of a Timeout, and the
/// group's round numbers stay in step. The collectives reject their own bad arguments the same
/// way. Returns the error: `InvalidArgument` with `e`, or `GroupError` for a non-member.
pub fn reject<C: Communicator + HostMapped + ?Sized>(c: &C, group: &Group, op: Op, e: ArgError) -> Result<()> {
    let rank = c.rank();
    group.member().at(rank)?;
    with_ctx(c, group, &CollOptions::default(), Plan::rejected(op), |ctx, p| {
        // A group out of step takes no more rounds; the error is this call's own.
        if p.out_of_step.is_none() {
            algo::reject(ctx, p)?;
        }
        Err(e).at(rank)
    })
}

/// Validates and runs an allreduce.
///
/// # Safety
/// `inp` valid for `len` reads and `out` for `len` writes of `dtype`; identical or disjoint.
#[allow(clippy::too_many_arguments)] // the pieces of both allreduce forms
pub(crate) unsafe fn run_allreduce<C: Communicator + HostMapped + ?Sized>(
    c: &C,
    group: &Group,
    inp: *const u8,
    out: *mut u8,
    len: usize,
    dtype: DType,
    op: ReduceOp,
    opts: &CollOptions,
) -> Result<()> {
    group.member().at(c.rank())?;
    let st = CollState::of(c, group, opts.before_blocking)?;
    let lp = match check_reduction(st, dtype, op, opts) {
        Ok(lp) => lp,
        Err(e) => return reject(c, group, Op::AllReduce, e),
    };
    let call = Call::new(K::AllReduce, dtype, Some(op), lp, 0, len);
    // SAFETY: forwarded.
    with_state(c, group, st, opts, Plan::new(Op::AllReduce, len, dtype).of(&call), |ctx, p| unsafe {
        algo::allreduce(ctx, p, call, inp, out)
    })
}

/// Validates the receive side of an alltoall whose send pieces (pointer, count, of `recv`'s
/// dtype) are `sends`, one per group rank, and runs it.
pub(crate) fn run_alltoall<C: Communicator + HostMapped + ?Sized>(
    c: &C,
    group: &Group,
    sends: &[(*const u8, usize)],
    mut recv: LocalMut<'_>,
    recv_counts: &[usize],
    opts: &CollOptions,
) -> Result<()> {
    let (n, dtype) = (group.size(), recv.dtype());
    let recv_part = Part { arg: "receive_tensor", ptr: recv.as_mut_ptr(), len: recv.len(), dtype };
    let bad = checks::alltoall_recv(sends, recv_part, recv_counts, n);
    if let Some(e) = bad {
        return reject(c, group, Op::AllToAll, e);
    }
    let (mut on_stack, mut on_heap) = ([0; 8], Vec::new());
    let send_counts = algo::scratch(&mut on_stack, &mut on_heap, n, 0);
    for (count, s) in send_counts.iter_mut().zip(sends) {
        *count = s.1;
    }
    let count = send_counts.iter().sum::<usize>();
    let plan = Plan { pairs: Some((send_counts, recv_counts)), ..Plan::new(Op::AllToAll, count, dtype) };
    let call = Call::new(K::AllToAll, dtype, None, None, 0, 0);
    with_ctx(c, group, opts, plan, |ctx, p| {
        // SAFETY: validated counts; the pieces come from LocalRef/LocalMut arguments.
        unsafe { algo::alltoall(ctx, p, call, sends, recv.as_mut_ptr(), recv_counts) }
    })
}
