//! Collectives: the contract every backend implements ([`Collectives`]), the host engine
//! ([`host`]), the implementation of backends whose ranks map their peers' heaps
//! ([`HostMapped`]), and the reference collectives ([`reference`](mod@reference)), written on the
//! stream-ordered primitives alone: a fallback for any backend (served with
//! [`by_reference`]: one per group, cached) and the oracle of the others.
//!
//! The collectives are allreduce, reduce_scatter, allgather, alltoall (list and single-buffer
//! forms), broadcast, send, recv and sendrecv, all group-aware. In the host engine, arguments
//! are validated on the calling rank; arguments that must agree
//! across ranks (counts, dtypes, ops, roots, low-precision formats) are compared in the first
//! round of every call, so a disagreement is an error on every rank instead of a hang or
//! corrupted data. Any memory is accepted: buffers inside the symmetric heap are read by peers
//! in place (zero-copy), others are staged through a per-group workspace.
//!
//! Results of allreduce are bit-identical on every rank: each element is reduced in group-rank
//! order in an accumulator type fixed by the dtype (f32 for 16- and 8-bit floats), whichever
//! algorithm (one-shot for small messages, reduce-scatter + allgather for large) ran.
//!
//! Concurrency: one thread at a time may drive a group; a second thread calling into a group
//! while another is inside a call gets `Error::ConcurrentUse` naming the group; collectives in
//! different groups never interfere (each group has its own workspace, flags and round
//! numbers).

mod algo;
pub mod by_reference;
mod checks;
pub mod copy;
pub(crate) mod eager;
pub mod host;
pub mod kernels;
pub(crate) mod ll;
pub mod lowp;
mod p2p;
pub mod reference;
pub(crate) mod state;
mod try_lock;
mod validate;
mod wait;

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::backend::HostMapped;
use crate::buffer::{LocalMut, LocalRef};
use crate::comm::Communicator;
use crate::dfx::{self, Op};
use crate::dtype::DType;
use crate::error::{ArgError, AtRank, Error, Result};
use crate::group::Group;
use crate::op::ReduceOp;
pub use algo::Kind;
use algo::{Call, Kind as K};
pub use p2p::eager_max_bytes;
pub use state::Tunables;
use state::{CollState, Ctx};
use validate::Plan;

/// The format the data of an allreduce or reduce_scatter travel in between members.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// The group's default from `SYMMETRIC_MEMORY_LOW_PRECISION_DTYPE`, for the data it suits
    /// (f32, f64, f16, bf16); full precision where it is unset and for other data.
    #[default]
    Default,
    /// Full precision, whatever the environment says (a loss or a metric in a job whose
    /// gradients travel compressed).
    Full,
    /// This format (fp16, bf16, fp8 e4m3, fp8 e5m2); the data must be f32, f64, f16 or bf16.
    Low(DType),
}

/// Options of a collective call.
#[derive(Clone, Copy, Debug, Default)]
pub struct CollOptions {
    /// The transport format of allreduce / reduce_scatter (other collectives move data as is).
    pub transport: Transport,
    /// Bound of every wait in the call (`None`: the communicator's default).
    pub timeout: Option<Duration>,
    /// Called in the calling thread when the call is about to stop spinning and block (it may
    /// be called more than once in a call, and not at all in one that never waits): a language
    /// binding holds its interpreter lock through the short spin of a small call and lets it go
    /// there (releasing and re-taking Python's GIL costs ~40 ns, a fifth of a small allreduce).
    pub before_blocking: Option<fn()>,
}

impl CollOptions {
    /// Options with a transport format.
    pub fn low_precision(lp: DType) -> Self {
        CollOptions { transport: Transport::Low(lp), ..Self::default() }
    }

    /// Options for full precision whatever the environment's default.
    pub fn full_precision() -> Self {
        CollOptions { transport: Transport::Full, ..Self::default() }
    }

    /// These options with `f` called when the call is about to block (see
    /// [`CollOptions::before_blocking`]).
    pub fn with_before_blocking(self, f: fn()) -> Self {
        CollOptions { before_blocking: Some(f), ..self }
    }
}

pub use checks::ranges_overlap;
use checks::Part;

/// Collective communication over a group. Every member calls the same collectives in the same
/// order; each call returns when the caller's part is complete and its buffers may be reused.
/// A member that cannot make its call (its arguments failed a check of its own) calls
/// [`reject`] in its place, so that the others fail with `PeerRejected`.
///
/// Each backend implements it: a backend whose ranks map their peers' heaps
/// ([`HostMapped`](crate::backend::HostMapped)) forwards to the host engine ([`host`]), others
/// bring their own (a device's kernels, a vendor library) or forward to the reference
/// collectives ([`by_reference`], [`collectives_by_reference!`](crate::collectives_by_reference)).
/// Whatever a backend provides keeps
/// this contract: the host engine's argument checks and errors, results bit-identical on every
/// member, and bounded waits.
pub trait Collectives: Communicator {
    /// In place: every member's `buf` becomes the reduction of all members' `buf`.
    fn allreduce(&self, group: &Group, buf: LocalMut<'_>, op: ReduceOp, opts: &CollOptions) -> Result<()>;

    /// Out of place: `output` becomes the reduction of every member's `input` (same length and
    /// dtype; the buffers are identical or disjoint).
    fn allreduce_into(
        &self,
        group: &Group,
        input: LocalRef<'_>,
        output: LocalMut<'_>,
        op: ReduceOp,
        opts: &CollOptions,
    ) -> Result<()>;

    /// `input` holds `group.size()` equal parts; member r's `output` becomes the reduction of
    /// part r over all members.
    fn reduce_scatter(
        &self,
        group: &Group,
        output: LocalMut<'_>,
        input: LocalRef<'_>,
        op: ReduceOp,
        opts: &CollOptions,
    ) -> Result<()>;

    /// Member r's `input` lands in part r of every member's `output` (`group.size()` parts).
    fn allgather(&self, group: &Group, output: LocalMut<'_>, input: LocalRef<'_>, opts: &CollOptions) -> Result<()>;

    /// The RFC's alltoall: `send[i]` goes to group rank i; what rank i sends lands in `recv`
    /// at the sum of `recv_counts[..i]`, and must be exactly `recv_counts[i]` elements.
    fn alltoall(
        &self,
        group: &Group,
        send: &[LocalRef<'_>],
        recv: LocalMut<'_>,
        recv_counts: &[usize],
        opts: &CollOptions,
    ) -> Result<()>;

    /// Single-buffer alltoall with split sizes: `send` holds `send_counts[i]` elements for rank
    /// i, back to back; `recv` receives `recv_counts[i]` from rank i, back to back.
    fn alltoall_single(
        &self,
        group: &Group,
        send: LocalRef<'_>,
        send_counts: &[usize],
        recv: LocalMut<'_>,
        recv_counts: &[usize],
        opts: &CollOptions,
    ) -> Result<()>;

    /// Every member's `buf` becomes group rank `root`'s `buf`. A broadcast of at most
    /// 256 bytes (8 KiB where ranks outnumber cores) returns at the root once its message is in
    /// every member's heap, without waiting for the members (up to 64 such broadcasts ahead of
    /// the slowest): a member whose arguments disagree with the root's fails, the root does not
    /// in that call but in a later collective of the group (see `docs/design.md`).
    fn broadcast(&self, group: &Group, buf: LocalMut<'_>, root: usize, opts: &CollOptions) -> Result<()>;

    /// Sends `buf` to group rank `dst`. Returns once the data is out of `buf`: buffered at the
    /// receiver for messages that fit its mailbox ([`eager_max_bytes`]), which therefore never
    /// wait for the receiver; larger ones stream as the receiver consumes them, or, when `buf`
    /// lies in the symmetric heap, are copied by the receiver straight out of `buf` (zero-copy).
    fn send(&self, group: &Group, buf: LocalRef<'_>, dst: usize, opts: &CollOptions) -> Result<()>;

    /// Receives into `buf` the next message from group rank `src`; it must have `buf`'s length
    /// and dtype (otherwise the message is consumed and an error names both).
    fn recv(&self, group: &Group, buf: LocalMut<'_>, src: usize, opts: &CollOptions) -> Result<()>;

    /// Sends `send` to group rank `dst` and receives into `recv` the next message from group
    /// rank `src`, both at once (MPI_Sendrecv, HcclBatchSendRecv with one send and one recv):
    /// neither direction waits for the other, so rings and pairwise exchanges of any size
    /// complete without ordering the calls by rank. The send is an ordinary message (the peer
    /// may take it with `recv` or `sendrecv`) and the receive takes any message (from `send`
    /// or `sendrecv`); order between a pair is kept. `dst` and `src` may be equal, and may be
    /// the caller itself (a message to oneself, any size). `send` and `recv` must not overlap.
    /// An incoming message of another size or dtype is consumed and fails the call naming both,
    /// after the send is complete. Returns once both are complete.
    fn sendrecv(
        &self,
        group: &Group,
        send: LocalRef<'_>,
        dst: usize,
        recv: LocalMut<'_>,
        src: usize,
        opts: &CollOptions,
    ) -> Result<()>;

    /// Fails this member's next collective call of `group` (recorded as `op`) with the argument
    /// error `e`, found by the caller before it could make the call (a language binding's own
    /// checks): the members waiting in their collective fail at once with
    /// [`Error::PeerRejected`] instead of a Timeout, and the group's rounds stay in step.
    /// Returns the error (`InvalidArgument` with `e`, or `GroupError` for a non-member).
    fn reject(&self, group: &Group, op: Op, e: ArgError) -> Result<()>;
}

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
fn check_reduction(
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
fn with_ctx<C: Communicator + HostMapped + ?Sized, T>(
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
fn with_state<C: Communicator + HostMapped + ?Sized, T>(
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
unsafe fn run_allreduce<C: Communicator + HostMapped + ?Sized>(
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
fn run_alltoall<C: Communicator + HostMapped + ?Sized>(
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

#[cfg(test)]
mod tests {
    use super::checks::transport_format;
    use super::*;

    #[test]
    fn the_environments_format_applies_where_it_suits_the_data_and_an_explicit_one_must() {
        use Transport::{Default, Full, Low};
        let bf16 = Ok(Some(DType::BF16));
        // The default: floating-point data travel in it, others in full precision.
        assert_eq!(transport_format(Default, &bf16, DType::F32), Ok(Some(DType::BF16)));
        assert_eq!(transport_format(Default, &bf16, DType::F64), Ok(Some(DType::BF16)));
        assert_eq!(transport_format(Default, &bf16, DType::I64), Ok(None));
        assert_eq!(transport_format(Default, &bf16, DType::U8), Ok(None));
        assert_eq!(transport_format(Default, &Ok(None), DType::F32), Ok(None));
        // The call's own format overrides the default, and must suit the data.
        assert_eq!(transport_format(Low(DType::F16), &bf16, DType::F32), Ok(Some(DType::F16)));
        let e = transport_format(Low(DType::BF16), &Ok(None), DType::I32).unwrap_err();
        assert!(e.to_string().contains("low_precision_dtype") && e.to_string().contains("int32"), "{e}");
        // Full precision on request, whatever the default.
        assert_eq!(transport_format(Full, &bf16, DType::F32), Ok(None));
        // A default the environment spells wrong fails every reduction that would use it.
        let bad = Err(ArgError::invalid(lowp::LOW_PRECISION_VAR, "fp7", "accepted: ..."));
        for dtype in [DType::F32, DType::I64] {
            let e = transport_format(Default, &bad, dtype).unwrap_err();
            assert!(e.to_string().contains(lowp::LOW_PRECISION_VAR), "{e}");
        }
        assert_eq!(transport_format(Full, &bad, DType::F32), Ok(None));
    }
}
