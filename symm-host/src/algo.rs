//! The collective algorithms, written once on the round protocol of [`state`](super::state).
//!
//! Data moves by *reading* peers' memory (pull): direct loads where the backend maps peers'
//! heaps, `get` otherwise; the one exception is the two-shot allreduce, whose reducers *write*
//! each reduced part into the outputs of the members that published a heap output (push: one
//! write instead of a write and a read back). Members publish where their data is each round,
//! so one member may pass a heap buffer (zero-copy) while another passes ordinary memory
//! (staged). Chunk sizes and algorithm choices depend only on arguments every member agrees on
//! (counts, dtype, format, group size, workspace size) and on facts every member published in
//! the round, never on where one member's data lives alone, so every member runs the same
//! rounds.

use super::eager;
use super::ll;
use super::state::{ready, Ctx, Progress, DONE, LEN, MAX, RED, REDUCED, SIG, SRC};
use symm_core::backend::HostMapped;
use symm_core::coll::copy::{copy, fence, Stores};
use symm_core::coll::kernels;
use symm_core::coll::lowp::{self, SubRun, SCALE_BLOCK};
use symm_core::dtype::DType;
use symm_core::error::{Error, Result};
use symm_core::op::ReduceOp;

/// Which collective a round belongs to (part of the signature members compare).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    AllReduce = 1,
    ReduceScatter = 2,
    AllGather = 3,
    Broadcast = 4,
    AllToAll = 5,
}

/// What a member was asked to do, as members compare it.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    pub dtype: DType,
    pub op: Option<ReduceOp>,
    pub lp: Option<DType>,
    pub root: usize,
    pub count: usize,
    /// Small broadcasts made in the group before this call ([`Progress::bcasts`], set by the
    /// algorithms): part of the signature, so that members which disagree on them (a small
    /// broadcast's root does not wait for its members, see [`eager`](super::eager)) fail.
    pub bcasts: u64,
    /// The signature but for `bcasts` (the kind, dtype, op, format and root), computed by
    /// [`Call::new`] from its arguments: computed from the fields, the one-byte ones just
    /// stored are read back with wider loads, which wait until those stores reach the cache
    /// (no store-to-load forwarding).
    what: i64,
}

/// Bits of the signature that carry [`Call::bcasts`] (modulo 2^15, keeping the signature
/// positive: -1 marks a rejection).
const BCASTS_SHIFT: u32 = 48;
const BCASTS_MASK: i64 = 0x7fff;

impl Call {
    /// A call of `kind` on `count` elements of `dtype` (reduced by `op`, carried in `lp`) with
    /// root `root`, before the algorithm marks it with the group's progress.
    pub fn new(kind: Kind, dtype: DType, op: Option<ReduceOp>, lp: Option<DType>, root: usize, count: usize) -> Call {
        Call { dtype, op, lp, root, count, bcasts: 0, what: Call::what(kind as i64, dtype, op, lp, root) }
    }

    /// The signature's fixed part: `kind` (bits 0-7), dtype, op, format (0xff: none) and the
    /// root modulo 2^16.
    #[inline]
    fn what(kind: i64, dtype: DType, op: Option<ReduceOp>, lp: Option<DType>, root: usize) -> i64 {
        kind | (i64::from(dtype.code()) << 8)
            | (op.map_or(0xff, |o| i64::from(o.code())) << 16)
            | (lp.map_or(0xff, |d| i64::from(d.code())) << 24)
            | ((root as i64 & 0xffff) << 32)
    }

    pub(super) fn sig(&self) -> i64 {
        // The fields are public: a change after `new` would leave the signature stale.
        debug_assert_eq!(self.what >> 8, Call::what(0, self.dtype, self.op, self.lp, self.root) >> 8);
        self.what | ((self.bcasts as i64 & BCASTS_MASK) << BCASTS_SHIFT)
    }

    /// Marks this call as made after the group's `p.bcasts` small broadcasts. In place, on the
    /// algorithm's own argument: a copy would read the four one-byte fields with one load,
    /// wider than each of the caller's stores of them, which waits until those stores reach
    /// the cache (no store-to-load forwarding), a stall of several nanoseconds per call.
    fn in_group(&mut self, p: &Progress) {
        self.bcasts = p.bcasts;
    }

    pub(super) fn describe(sig: i64, len: i64) -> String {
        if super::validate::is_validation(sig) {
            return super::validate::describe_validation(len);
        }
        let dtype = DType::from_code((sig >> 8) & 0xff).map_or_else(|_| "?".into(), |d| d.to_string());
        let op = match (sig >> 16) & 0xff {
            0xff => String::new(),
            c => format!(", op={}", ReduceOp::from_code(c).map_or_else(|_| "?".into(), |o| o.to_string())),
        };
        let lp = match (sig >> 24) & 0xff {
            0xff => String::new(),
            c => format!(", low_precision={}", DType::from_code(c).map_or_else(|_| "?".into(), |d| d.to_string())),
        };
        let kind = match sig & 0xff {
            1 => "allreduce",
            2 => "reduce_scatter",
            3 => "allgather",
            4 => "broadcast",
            5 => "alltoall",
            _ => "?",
        };
        let root = if sig & 0xff == 4 { format!(", root={}", (sig >> 32) & 0xffff) } else { String::new() };
        let after = match (sig >> BCASTS_SHIFT) & BCASTS_MASK {
            0 => String::new(),
            b => format!(" after {b} small broadcasts (mod {})", BCASTS_MASK + 1),
        };
        format!("{kind}(count={len}, dtype={dtype}{op}{lp}{root}){after}")
    }
}

/// A round number, taken from the group's progress.
fn next_round(p: &mut Progress) -> u64 {
    p.seq += 1;
    p.seq
}

/// Waits for every peer's READY and checks that everyone was asked the same thing. On
/// disagreement every member sees the same facts, so all of them fail the same way; they
/// still finish the round (DONE) so the group stays usable.
fn agree<B: HostMapped + ?Sized>(ctx: &Ctx<'_, B>, seq: u64, call: &Call, compare_len: bool) -> Result<()> {
    ctx.wait_all(ready(seq), seq, "ready")?;
    for j in (0..ctx.n).filter(|&j| j != ctx.me) {
        let (sig, len) = (ctx.read_fact(j, seq, SIG), ctx.read_fact(j, seq, LEN));
        if let Some(e) = disagreement(ctx, call, compare_len, j, sig, len) {
            ctx.signal_all(DONE, seq)?;
            return Err(e);
        }
    }
    Ok(())
}

/// Joins a round only to tell the peers that this member rejected its arguments; they fail
/// with `PeerRejected` instead of waiting for it. First looks whether the peers run the call as
/// a small broadcast, which has no round ([`eager::reject`]): whatever the rejected call was
/// (a binding may reject any call through another one), the peers are the ones waiting.
pub fn reject<B: HostMapped + ?Sized>(ctx: &Ctx<'_, B>, p: &mut Progress) -> Result<()> {
    if eager::reject(ctx, p)? {
        return Ok(());
    }
    let seq = next_round(p);
    ctx.publish(seq, [0, 0, -1, 0, 0])?;
    ctx.signal_all(DONE, seq)?;
    // Like every round, hear from every peer before the next (their READY: a peer on the
    // small-message path switches to the round protocol on seeing mine).
    ctx.wait_all(ready(seq), seq, "ready")
}

/// The error member `j`'s `sig`/`len` give against the caller's call, which they disagree with:
/// [`disagreement`], comparing the counts.
pub(super) fn mismatch<B: HostMapped + ?Sized>(ctx: &Ctx<'_, B>, call: &Call, j: usize, sig: i64, len: i64) -> Error {
    disagreement(ctx, call, true, j, sig, len).unwrap_or_else(|| Error::Mismatch {
        rank: ctx.b.rank(),
        op: ctx.op.into(),
        peer: ctx.group.ranks()[j],
        mine: Call::describe(call.sig(), call.count as i64),
        theirs: format!("{} (not sending)", Call::describe(sig, len)),
    })
}

/// Whether `sig`/`len` from member `j` disagree with the caller's call (`len` compared when
/// `compare_len`): the error every member reports for it.
fn disagreement<B: HostMapped + ?Sized>(
    ctx: &Ctx<'_, B>,
    call: &Call,
    compare_len: bool,
    j: usize,
    sig: i64,
    len: i64,
) -> Option<Error> {
    let (mine_sig, mine_len) = (call.sig(), call.count as i64);
    let peer = ctx.group.ranks()[j];
    if sig == -1 {
        Some(Error::PeerRejected { rank: ctx.b.rank(), op: ctx.op.into(), peer })
    } else if sig != mine_sig || (compare_len && len != mine_len) {
        Some(Error::Mismatch {
            rank: ctx.b.rank(),
            op: ctx.op.into(),
            peer,
            mine: Call::describe(mine_sig, mine_len),
            theirs: Call::describe(sig, len),
        })
    } else {
        None
    }
}

/// Largest chunk (elements) whose staged form fits in `bytes` of workspace.
fn stage_capacity(bytes: usize, dtype: DType, lp: Option<DType>) -> usize {
    match lp {
        // Exponents cost 4 bytes per SCALE_BLOCK elements; keep whole blocks.
        Some(l) => (bytes * SCALE_BLOCK / (SCALE_BLOCK * l.size() + 4) / SCALE_BLOCK).saturating_sub(1) * SCALE_BLOCK,
        None => bytes / dtype.size(),
    }
    .max(1)
}

/// The part of a chunk of `c` elements that member `k` of `n` reduces (two-shot).
fn part(c: usize, n: usize, k: usize) -> (usize, usize) {
    let p = c.div_ceil(n).div_ceil(SCALE_BLOCK) * SCALE_BLOCK;
    let lo = (k * p).min(c);
    (lo, (lo + p).min(c))
}

/// allreduce from `inp` into `out` (which may be the same memory), `count` elements.
///
/// # Safety
/// `inp` is valid for reads and `out` for writes of `count` elements of `call.dtype`; they are
/// identical or disjoint.
pub unsafe fn allreduce<B: HostMapped + ?Sized>(
    ctx: &Ctx<'_, B>,
    p: &mut Progress,
    call: Call,
    inp: *const u8,
    out: *mut u8,
) -> Result<()> {
    let mut call = call;
    call.in_group(p);
    let size = call.dtype.size();
    let bytes = call.count * size;
    let small = bytes <= ctx.st.tun.allreduce_ll_max && ll::fits(ctx, bytes);
    // SAFETY: forwarded.
    if call.lp.is_none() && small && unsafe { small_allreduce(ctx, p, call, inp, out)? } {
        return Ok(());
    }
    let tun = &ctx.st.tun;
    let oneshot_max = tun.oneshot_max.min(tun.stage_bytes / 2);
    let oneshot_cap = stage_capacity(tun.stage_bytes / 2, call.dtype, call.lp);
    if bytes <= oneshot_max && call.count <= oneshot_cap {
        // SAFETY: forwarded.
        return unsafe { one_shot(ctx, p, call, inp, out) };
    }
    // Chunk so that a staged chunk fits the whole workspace, in whole parts.
    let chunk = two_shot_chunk(tun.stage_bytes, call.dtype, call.lp, ctx.n, call.count);
    let mut c0 = 0;
    while c0 < call.count {
        let c = chunk.min(call.count - c0);
        // SAFETY: the chunk lies inside both buffers.
        unsafe { two_shot(ctx, p, call, c, inp.add(c0 * size), out.add(c0 * size))? };
        c0 += c;
    }
    Ok(())
}

/// `n` elements of scratch: on the stack for groups of up to 8 members (the small-message
/// paths then make no allocation per call), else in `heap`.
pub(super) fn scratch<'a, T: Copy>(stack: &'a mut [T; 8], heap: &'a mut Vec<T>, n: usize, fill: T) -> &'a mut [T] {
    if n <= stack.len() {
        &mut stack[..n]
    } else {
        heap.resize(n, fill);
        heap
    }
}

/// Room for `n` messages of `bytes` back to back, in the group's inbox (kept between calls:
/// no allocation per call once it has grown). Valid until the inbox is next asked for room.
fn inbox(p: &mut Progress, n: usize, bytes: usize) -> *mut u8 {
    p.inbox.reserve(n * bytes);
    p.inbox.as_mut_ptr()
}

/// One round of `call` on the small-message path ([`ll::round`]), where every member must send
/// the same signature and count (all but alltoall). False: a peer runs the round protocol.
///
/// # Safety
/// As [`ll::round`].
unsafe fn small_round<B: HostMapped + ?Sized>(
    ctx: &Ctx<'_, B>,
    p: &mut Progress,
    call: &Call,
    msg: impl Fn(usize) -> ll::Msg,
    into: impl Fn(usize) -> Option<(*mut u8, usize)>,
) -> Result<bool> {
    // SAFETY: forwarded.
    unsafe { ll::round(ctx, p, call.sig(), msg, |j, sig, len| disagreement(ctx, call, true, j, sig, len), into) }
}

/// Reduces, in group-rank order, the caller's `own` part and every peer's message gathered at
/// `room + j * bytes` by a small round, `count` elements each, into `out`.
///
/// # Safety
/// `own` holds `count` elements; the inbox holds every peer's; `out` holds `count` and is `own`
/// itself or disjoint from every source.
unsafe fn reduce_inbox<B: HostMapped + ?Sized>(
    ctx: &Ctx<'_, B>,
    call: &Call,
    own: *const u8,
    room: *mut u8,
    bytes: usize,
    out: *mut u8,
) {
    let (mut on_stack, mut on_heap) = ([std::ptr::null::<u8>(); 8], Vec::new());
    let srcs = scratch(&mut on_stack, &mut on_heap, ctx.n, std::ptr::null());
    for (j, src) in srcs.iter_mut().enumerate() {
        *src = if j == ctx.me { own } else { room.wrapping_add(j * bytes) };
    }
    // SAFETY: caller's contract.
    unsafe { kernels::reduce(call.dtype, call.op.expect("a reduction has an op"), srcs, out, call.count) };
}

/// allreduce on the small-message path: every member sends its input to every peer and
/// reduces all of them in group-rank order (the one-shot result, bit for bit). False: a peer
/// runs the round protocol (nothing done).
///
/// # Safety
/// As [`allreduce`], with the size within [`ll::fits`].
unsafe fn small_allreduce<B: HostMapped + ?Sized>(
    ctx: &Ctx<'_, B>,
    p: &mut Progress,
    call: Call,
    inp: *const u8,
    out: *mut u8,
) -> Result<bool> {
    let bytes = call.count * call.dtype.size();
    let room = inbox(p, ctx.n, bytes);
    let msg = ll::Msg { data: inp, bytes, count: call.count };
    // SAFETY: `inp` holds `bytes`; the inbox holds a message of `bytes` per member.
    let done = unsafe { small_round(ctx, p, &call, |_| msg, |j| Some((room.wrapping_add(j * bytes), bytes)))? };
    if done {
        // SAFETY: every message holds `count` elements; `out` is the input itself or disjoint
        // from it (contract) and from the inbox (local scratch).
        unsafe { reduce_inbox(ctx, &call, inp, room, bytes, out) };
    }
    Ok(done)
}

/// Every member reduces all members' inputs itself: each member's input read in place where it
/// lies in its heap (out of place, with a core per rank: see [`one_shot_in_place_source`]), or
/// else a copy staged in its workspace.
///
/// # Safety
/// As [`allreduce`].
unsafe fn one_shot<B: HostMapped + ?Sized>(
    ctx: &Ctx<'_, B>,
    p: &mut Progress,
    call: Call,
    inp: *const u8,
    out: *mut u8,
) -> Result<()> {
    let seq = next_round(p);
    let count = call.count;
    let zc_in = one_shot_in_place_source(ctx, &call, inp, out);
    let src_off = match zc_in {
        Some(off) => off,
        None => {
            let half = (seq % 2) as usize;
            let half_bytes = ctx.st.tun.stage_bytes / 2;
            if p.stage_round[half] > 0 {
                ctx.wait_all(DONE, p.stage_round[half], "done")?;
            }
            let stage = ctx.my_stage().wrapping_add(half * half_bytes);
            match call.lp {
                Some(lp) => {
                    let run = lowp::sub_run(stage, lp, count, 0, count);
                    // SAFETY: the run fits the half (one-shot limit); `inp` holds `count`
                    // elements.
                    unsafe { lowp::encode(call.dtype, lp, inp, count, run.exps.cast_mut(), run.payload.cast_mut()) };
                }
                // SAFETY: the half holds at least `bytes` (one-shot limit); the stage and the
                // user's buffer are disjoint (a user buffer cannot be inside the workspace).
                None => unsafe { copy(inp, stage, count * call.dtype.size(), Stores::Cached) },
            }
            p.stage_round[half] = seq;
            ctx.st.stage.heap_offset() + half * half_bytes
        }
    };
    ctx.publish(seq, [src_off as i64, 0, call.sig(), count as i64, 0])?;
    agree(ctx, seq, &call, true)?;
    let bytes = match call.lp {
        Some(lp) => lowp::encoded_bytes(lp, count),
        None => count * call.dtype.size(),
    };
    // Copies fetched with `get` land here; mapped heaps are read in place. Small groups keep
    // their source pointers on the stack: this path is all small messages, where an allocation
    // is a measurable part of the call.
    let mut tmps: Vec<Vec<u8>> = if ctx.mapped.is_some() { Vec::new() } else { vec![Vec::new(); ctx.n] };
    let mut unused = Vec::new();
    let (mut on_stack, mut on_heap) = ([std::ptr::null::<u8>(); 8], Vec::new());
    let srcs = scratch(&mut on_stack, &mut on_heap, ctx.n, std::ptr::null());
    for (j, src) in srcs.iter_mut().enumerate() {
        let off = if j == ctx.me { src_off } else { ctx.read_fact(j, seq, SRC) as usize };
        let tmp = match tmps.get_mut(j) {
            Some(t) => t,
            None => &mut unused,
        };
        *src = ctx.fetch(j, off, bytes, tmp)?;
    }
    let srcs = &*srcs;
    match call.lp {
        Some(lp) => {
            let runs: Vec<SubRun> = srcs.iter().map(|&s| lowp::sub_run(s, lp, count, 0, count)).collect();
            let op = call.op.expect("allreduce has an op");
            // SAFETY: every run holds `count` encoded elements; `out` holds `count` elements
            // and is not inside any staging area.
            unsafe { lowp::reduce_encoded(call.dtype, lp, op, &runs, count, out) };
        }
        // SAFETY: every source holds `count` elements (published for this round), `out` too;
        // `out` is the user's buffer, disjoint from every staging area and from `inp` when the
        // peers read `inp` in place.
        None => unsafe { kernels::reduce(call.dtype, call.op.expect("allreduce has an op"), srcs, out, count) },
    }
    ctx.signal_all(DONE, seq)?;
    if zc_in.is_some() {
        // The peers read the caller's input in place: it is the caller's again once every peer
        // has reduced.
        ctx.wait_all(DONE, seq, "done")?;
    }
    Ok(())
}

/// The heap offset at which the peers of a one-shot allreduce read the caller's input in place,
/// or `None` to stage a copy. In place needs the input inside the caller's heap, no
/// low-precision encoding, an output that does not overlap the input (the peers read it while
/// the caller writes its output), and a core per rank: the caller then waits for every peer's
/// `DONE` before returning, a hand-over of the core per peer where ranks share cores. With a
/// core per rank, the wait costs about what a staged copy would with fresh inputs, and with inputs
/// unchanged between calls (nccl-tests) the peers' reads stay in their caches (see
/// docs/performance-log.md, "The one-shot reads a heap input in place"). Each member decides
/// for itself: peers read from whatever offset it publishes.
fn one_shot_in_place_source<B: HostMapped + ?Sized>(
    ctx: &Ctx<'_, B>,
    call: &Call,
    inp: *const u8,
    out: *mut u8,
) -> Option<usize> {
    let bytes = call.count * call.dtype.size();
    if call.lp.is_some() || symm_core::coll::ranges_overlap(inp, bytes, out, bytes) || ctx.b.waiters_share_cores() {
        return None;
    }
    ctx.heap_offset_of(inp, bytes)
}

/// Where a two-shot chunk of `c` elements carried in format `lp` keeps, in the workspace, its
/// reducer's part of the result (in the data dtype): after the encoded chunk, on a cache line.
fn result_offset(lp: DType, c: usize) -> usize {
    lowp::encoded_bytes(lp, c).next_multiple_of(64)
}

/// Whether a two-shot chunk of `c` elements fits a workspace of `stage_bytes`: the staged
/// chunk and, with a format, the largest part of the result in the data dtype after it.
fn two_shot_fits(stage_bytes: usize, dtype: DType, lp: Option<DType>, n: usize, c: usize) -> bool {
    match lp {
        None => c * dtype.size() <= stage_bytes,
        Some(l) => result_offset(l, c) + part(c, n, 0).1 * dtype.size() <= stage_bytes,
    }
}

/// The least staging area a group of `n` members works with, whatever `SYMM_COLL_WORKSPACE`
/// says: one two-shot unit (a block of [`SCALE_BLOCK`] elements per member, 8 bytes each at
/// most) and, with a format, the widest result part after it on its own cache line. Every
/// member of a group computes the same, so they agree on the workspace's size.
pub(super) fn min_stage_bytes(n: usize) -> usize {
    (n + 1) * SCALE_BLOCK * 8 + 64
}

/// The two-shot chunk of an allreduce of `count` elements: all of them when they fit the
/// workspace, else the most whole parts (`n` blocks of [`SCALE_BLOCK`]) that fit.
fn two_shot_chunk(stage_bytes: usize, dtype: DType, lp: Option<DType>, n: usize, count: usize) -> usize {
    if two_shot_fits(stage_bytes, dtype, lp, n, count) {
        return count;
    }
    let unit = n * SCALE_BLOCK;
    // Bytes per element: the staged form, plus with a format the result part (1/n of it).
    let estimate = match lp {
        None => stage_bytes / dtype.size(),
        Some(l) => stage_bytes * unit / (n * (SCALE_BLOCK * l.size() + 4) + SCALE_BLOCK * dtype.size()),
    };
    let mut units = (estimate / unit).max(1);
    while units > 1 && !two_shot_fits(stage_bytes, dtype, lp, n, units * unit) {
        units -= 1;
    }
    // One unit always fits: a group's workspace is at least [`min_stage_bytes`].
    debug_assert!(two_shot_fits(stage_bytes, dtype, lp, n, units * unit), "workspace {stage_bytes} for {n}");
    units * unit
}

/// Reduce-scatter then allgather over one chunk of `c` elements: member k reduces part k of
/// every member's data, then everyone copies every part. With a transport format only the
/// inputs travel encoded: each reducer decodes the parts, accumulates them in group-rank order
/// and rounds once into the data dtype, and the result travels in the data dtype, so that
/// every member holds what one member reducing everything would (the one-shot result).
///
/// # Safety
/// As [`allreduce`] for `c` elements.
unsafe fn two_shot<B: HostMapped + ?Sized>(
    ctx: &Ctx<'_, B>,
    p: &mut Progress,
    call: Call,
    c: usize,
    inp: *const u8,
    out: *mut u8,
) -> Result<()> {
    let size = call.dtype.size();
    let seq = next_round(p);
    for r in p.stage_round {
        if r > 0 {
            ctx.wait_all(DONE, r, "done")?;
        }
    }
    p.stage_round = [0, 0];
    let stage = ctx.my_stage();
    let stage_off = ctx.st.stage.heap_offset();
    // Encoded inputs are always staged; results, in the data dtype, may be pushed into a heap
    // output whatever the transport (the input was encoded before any peer writes).
    let zc_in = if call.lp.is_none() { ctx.heap_offset_of(inp, c * size) } else { None };
    let zc_out = ctx.heap_offset_of(out, c * size);
    let (lo, hi) = part(c, ctx.n, ctx.me);
    let len = hi - lo;
    // An input staged in the data dtype leaves my own part where it is: only I read it.
    let own_from_input = zc_in.is_none() && call.lp.is_none();
    let src_off = match (zc_in, call.lp) {
        (Some(off), _) => off,
        (None, Some(lp)) => {
            let run = lowp::sub_run(stage, lp, c, 0, c);
            // SAFETY: the encoded chunk fits the workspace (chunking); `inp` holds `c`.
            unsafe { lowp::encode(call.dtype, lp, inp, c, run.exps.cast_mut(), run.payload.cast_mut()) };
            stage_off
        }
        (None, None) => {
            // SAFETY: the chunk fits the workspace; user memory is disjoint from it; the parts
            // before and after mine lie inside both.
            unsafe {
                copy(inp, stage, lo * size, Stores::Cached);
                copy(inp.add(hi * size), stage.add(hi * size), (c - hi) * size, Stores::Cached);
            }
            stage_off
        }
    };
    // Where my part of the result is, for the members that read it: in my heap output, else in
    // my workspace (in the slot of my own part, which a staged input leaves unwritten; with a
    // format after the encoded chunk, as the result is wider than its encoding).
    let stage_result = match call.lp {
        Some(lp) => result_offset(lp, c),
        None => lo * size,
    };
    let red_off = zc_out.map_or(stage_off + stage_result, |off| off + lo * size);
    // Members whose output is in their heap take every part pushed into it by its reducer
    // (one write, no read back); the others read each part from where its reducer left it.
    let push_to_me = zc_out.is_some();
    ctx.publish(seq, [src_off as i64, red_off as i64, call.sig(), call.count as i64, i64::from(push_to_me)])?;
    agree(ctx, seq, &call, true)?;
    let op = call.op.expect("allreduce has an op");
    let pushed = |j: usize| if j == ctx.me { push_to_me } else { ctx.read_fact(j, seq, MAX) == 1 };
    let stores = Stores::for_bytes(call.count * size, ctx.st.tun.stream_min);

    // Reduce my part of every member's data.
    let mut tmps: Vec<Vec<u8>> = vec![Vec::new(); 2 * ctx.n];
    if len > 0 {
        // My part goes into my output, into my workspace when a member reads it from there (my
        // output is not in the heap and someone takes no pushes), and into the output of every
        // member that takes pushes: directly where its heap is mapped, with `put` after the
        // reduction otherwise.
        let mut dsts = vec![out.wrapping_add(lo * size)];
        if zc_out.is_none() && (0..ctx.n).any(|j| j != ctx.me && !pushed(j)) {
            dsts.push(stage.wrapping_add(stage_result));
        }
        let mut puts = Vec::new();
        for j in (0..ctx.n).filter(|&j| j != ctx.me && pushed(j)) {
            // Member j published where its own part of its output is.
            let off = ctx.read_fact(j, seq, RED) as usize - part(c, ctx.n, j).0 * size + lo * size;
            match ctx.mapped {
                Some(bases) => dsts.push(bases[j].0.wrapping_add(off)),
                None => puts.push((ctx.group.ranks()[j], off)),
            }
        }
        match call.lp {
            Some(lp) => {
                let ((e_off, e_len), (p_off, p_len)) = lowp::part_layout(lp, c, lo, len);
                let mut parts = Vec::with_capacity(ctx.n);
                for (j, pair) in tmps.chunks_mut(2).enumerate() {
                    let base = if j == ctx.me { src_off } else { ctx.read_fact(j, seq, SRC) as usize };
                    let (a, b) = pair.split_at_mut(1);
                    let exps = ctx.fetch(j, base + e_off, e_len, &mut a[0])?;
                    let payload = ctx.fetch(j, base + p_off, p_len, &mut b[0])?;
                    parts.push(SubRun { exps: exps.cast(), payload });
                }
                // SAFETY: every part holds `len` encoded elements, in group-rank order. The
                // destinations hold `len` elements each and are pairwise disjoint and disjoint
                // from the encoded parts: my output part (user memory or my heap output, never
                // the workspace), my workspace's result area (past the encoded chunk), and
                // member j's output part `lo..hi`, which only I write this round (its input
                // was encoded into its workspace before it published).
                unsafe { lowp::reduce_encoded_fan_out(call.dtype, lp, op, &parts, len, &dsts, stores) };
            }
            None => {
                let mut srcs = Vec::with_capacity(ctx.n);
                for (j, tmp) in tmps.iter_mut().take(ctx.n).enumerate() {
                    if j == ctx.me && own_from_input {
                        srcs.push(inp.wrapping_add(lo * size));
                        continue;
                    }
                    let base = if j == ctx.me { src_off } else { ctx.read_fact(j, seq, SRC) as usize };
                    srcs.push(ctx.fetch(j, base + lo * size, len * size, tmp)?);
                }
                // SAFETY: sources hold `len` elements each. The destinations hold `len`
                // elements each and are pairwise disjoint: my output part (identical to my own
                // source part in place, else disjoint from every source), my workspace part,
                // and member j's output part `lo..hi`, which only I write this round and which
                // is member j's source part (in place, read in the same block) or disjoint
                // from every source.
                unsafe { kernels::reduce_fan_out(call.dtype, op, &srcs, &dsts, len, stores) };
            }
        }
        for (peer, off) in puts {
            // SAFETY: my output part holds the `len` reduced elements; member j published its
            // output, which holds the chunk, at `off - lo * size`.
            unsafe { ctx.b.put_bytes(peer, off, out.add(lo * size), len * size)? };
        }
    }
    ctx.signal_all(REDUCED, seq)?;
    ctx.wait_all(REDUCED, seq, "reduced")?;

    // Gather every other member's part, unless they pushed it: the result, in the data dtype.
    for k in (0..ctx.n).filter(|&k| k != ctx.me && !push_to_me) {
        let (lo, hi) = part(c, ctx.n, k);
        if hi == lo {
            continue;
        }
        let len = hi - lo;
        let src = ctx.fetch(k, ctx.read_fact(k, seq, RED) as usize, len * size, &mut tmps[0])?;
        // SAFETY: `src` holds `len` elements of member k's result; `out` holds the chunk and is
        // disjoint from member k's memory.
        unsafe { copy(src, out.add(lo * size), len * size, stores) };
    }
    fence(stores);
    ctx.signal_all(DONE, seq)?;
    // Peers read my input and my result part: wait until they are done before the caller may
    // touch either again.
    ctx.wait_all(DONE, seq, "done")
}

/// Lets the staging area go once peers are done with it, or waits now when peers read user
/// memory directly (zero-copy) that the caller may change after return.
fn finish_round<B: HostMapped + ?Sized>(ctx: &Ctx<'_, B>, p: &mut Progress, seq: u64, zero_copy: bool) -> Result<()> {
    ctx.signal_all(DONE, seq)?;
    if zero_copy {
        ctx.wait_all(DONE, seq, "done")
    } else {
        p.stage_round = [seq, seq];
        Ok(())
    }
}

/// Waits until peers no longer read the workspace.
fn free_stage<B: HostMapped + ?Sized>(ctx: &Ctx<'_, B>, p: &mut Progress) -> Result<()> {
    for r in p.stage_round {
        if r > 0 {
            ctx.wait_all(DONE, r, "done")?;
        }
    }
    p.stage_round = [0, 0];
    Ok(())
}

/// The chunks `(start, len)` of `total` elements, `chunk` at most each; one empty chunk when
/// `total` is 0 (the call still takes a round, so members agree even on empty calls).
fn chunks(total: usize, chunk: usize) -> impl Iterator<Item = (usize, usize)> {
    let chunk = chunk.max(1);
    (0..total.div_ceil(chunk).max(1)).map(move |i| (i * chunk, chunk.min(total - (i * chunk).min(total))))
}

/// Where peers read `bytes` at `src` this round: in place when the memory is in the caller's
/// heap (`zero_copy`: its heap offset), else copied into the workspace (once peers are done
/// with it).
///
/// # Safety
/// `src` is valid for `bytes` reads and `bytes` fits the workspace.
unsafe fn expose<B: HostMapped + ?Sized>(
    ctx: &Ctx<'_, B>,
    p: &mut Progress,
    zero_copy: Option<usize>,
    src: *const u8,
    bytes: usize,
) -> Result<usize> {
    if let Some(off) = zero_copy {
        return Ok(off);
    }
    free_stage(ctx, p)?;
    // SAFETY: the bytes fit the workspace (contract); user memory is disjoint from it.
    unsafe { copy(src, ctx.my_stage(), bytes, Stores::Cached) };
    Ok(ctx.st.stage.heap_offset())
}

/// reduce_scatter: `inp` holds `n * m` elements, `out` gets `m`, the reduction of part `me`.
///
/// # Safety
/// `inp` valid for `n * m` reads, `out` for `m` writes; `out` is part `me` of `inp` or
/// disjoint from it.
pub unsafe fn reduce_scatter<B: HostMapped + ?Sized>(
    ctx: &Ctx<'_, B>,
    p: &mut Progress,
    call: Call,
    inp: *const u8,
    out: *mut u8,
) -> Result<()> {
    let mut call = call;
    call.in_group(p);
    let (n, m, size) = (ctx.n, call.count, call.dtype.size());
    if call.lp.is_none() && ll::fits(ctx, m * size) {
        let room = inbox(p, n, m * size);
        let part = |j: usize| inp.wrapping_add(j * m * size);
        let msg = |j: usize| ll::Msg { data: part(j), bytes: m * size, count: m };
        // SAFETY: part j of `inp` holds `m` elements; the inbox holds `m` per member.
        let done = unsafe { small_round(ctx, p, &call, msg, |j| Some((room.wrapping_add(j * m * size), m * size)))? };
        if done {
            // SAFETY: every message holds `m` elements; `out` is my own part of `inp` or
            // disjoint from every source.
            unsafe { reduce_inbox(ctx, &call, part(ctx.me), room, m * size, out) };
            return Ok(());
        }
    }
    let per_part = match call.lp {
        Some(lp) => stage_capacity(ctx.st.tun.stage_bytes / n, call.dtype, Some(lp)),
        None => ctx.st.tun.stage_bytes / n / size,
    }
    .max(1);
    let zc = if call.lp.is_none() { ctx.heap_offset_of(inp, n * m * size) } else { None };
    let op = call.op.expect("reduce_scatter has an op");
    let stores = Stores::for_bytes(m * size, ctx.st.tun.stream_min);
    for (c0, cm) in chunks(m, per_part) {
        let seq = next_round(p);
        let (src_off, stride) = match (zc, call.lp) {
            (Some(off), _) => (off + c0 * size, m * size),
            (None, lp) => {
                free_stage(ctx, p)?;
                let stage = ctx.my_stage();
                let stride = lp.map_or(cm * size, |l| lowp::encoded_bytes(l, cm));
                for k in 0..n {
                    // SAFETY: part k's chunk is inside `inp`; slot k of the workspace holds
                    // `stride` bytes (chunking); user memory is disjoint from the workspace.
                    unsafe {
                        let src = inp.add((k * m + c0) * size);
                        let dst = stage.add(k * stride);
                        match lp {
                            Some(l) => {
                                let run = lowp::sub_run(dst, l, cm, 0, cm);
                                lowp::encode(call.dtype, l, src, cm, run.exps.cast_mut(), run.payload.cast_mut());
                            }
                            None => copy(src, dst, cm * size, Stores::Cached),
                        }
                    }
                }
                (ctx.st.stage.heap_offset(), stride)
            }
        };
        ctx.publish(seq, [src_off as i64, 0, call.sig(), m as i64, stride as i64])?;
        agree(ctx, seq, &call, true)?;
        let bytes = call.lp.map_or(cm * size, |l| lowp::encoded_bytes(l, cm));
        let mut tmps: Vec<Vec<u8>> = vec![Vec::new(); n];
        let mut srcs = Vec::with_capacity(n);
        for (j, tmp) in tmps.iter_mut().enumerate() {
            let (base, stride) = if j == ctx.me {
                (src_off, stride)
            } else {
                (ctx.read_fact(j, seq, SRC) as usize, ctx.read_fact(j, seq, MAX) as usize)
            };
            srcs.push(ctx.fetch(j, base + ctx.me * stride, bytes, tmp)?);
        }
        // SAFETY: every source holds this chunk of part `me`; `out` holds `m` elements and is
        // either exactly my own zero-copy source part or disjoint from all sources.
        unsafe {
            let dst = out.add(c0 * size);
            match call.lp {
                Some(l) => {
                    let runs: Vec<SubRun> = srcs.iter().map(|&s| lowp::sub_run(s, l, cm, 0, cm)).collect();
                    lowp::reduce_encoded(call.dtype, l, op, &runs, cm, dst);
                }
                None => kernels::reduce_fan_out(call.dtype, op, &srcs, &[dst], cm, stores),
            }
        }
        finish_round(ctx, p, seq, zc.is_some())?;
    }
    Ok(())
}

/// allgather: `inp` holds `m` elements, `out` gets `n * m` in member order.
///
/// # Safety
/// `inp` valid for `m` reads, `out` for `n * m` writes; `inp` is part `me` of `out` or
/// disjoint from it.
pub unsafe fn allgather<B: HostMapped + ?Sized>(
    ctx: &Ctx<'_, B>,
    p: &mut Progress,
    call: Call,
    inp: *const u8,
    out: *mut u8,
) -> Result<()> {
    let mut call = call;
    call.in_group(p);
    let (n, m, size) = (ctx.n, call.count, call.dtype.size());
    if ll::fits(ctx, m * size) {
        let msg = ll::Msg { data: inp, bytes: m * size, count: m };
        let slot = |j: usize| out.wrapping_add(j * m * size);
        // SAFETY: `inp` holds `m` elements, every slot of `out` too.
        let done = unsafe { small_round(ctx, p, &call, |_| msg, |j| Some((slot(j), m * size)))? };
        if done {
            // SAFETY: my slot of `out` holds `m` elements and is `inp` itself (in place, which
            // `copy` skips) or disjoint from it.
            unsafe { copy(inp, slot(ctx.me), m * size, Stores::Cached) };
            return Ok(());
        }
    }
    let zc = ctx.heap_offset_of(inp, m * size);
    let stores = Stores::for_bytes(n * m * size, ctx.st.tun.stream_min);
    for (c0, cm) in chunks(m, ctx.st.tun.stage_bytes / size) {
        let seq = next_round(p);
        // SAFETY: the chunk lies inside `inp` and fits the workspace.
        let src = unsafe { inp.add(c0 * size) };
        // SAFETY: as above.
        let src_off = unsafe { expose(ctx, p, zc.map(|off| off + c0 * size), src, cm * size)? };
        ctx.publish(seq, [src_off as i64, 0, call.sig(), m as i64, 0])?;
        agree(ctx, seq, &call, true)?;
        let mut tmp = Vec::new();
        for j in 0..n {
            // SAFETY: slot j's chunk lies inside `out`.
            let dst = unsafe { out.add((j * m + c0) * size) };
            let from =
                if j == ctx.me { src } else { ctx.fetch(j, ctx.read_fact(j, seq, SRC) as usize, cm * size, &mut tmp)? };
            // SAFETY: `from` holds the chunk; `dst` is in `out`; my own slot may be exactly my
            // input (in-place), which `copy` skips.
            unsafe { copy(from, dst, cm * size, stores) };
        }
        fence(stores);
        finish_round(ctx, p, seq, zc.is_some())?;
    }
    Ok(())
}

/// broadcast of `count` elements from member `root` into every member's `buf`.
///
/// # Safety
/// `buf` valid for `count` reads (root) or writes (others).
pub unsafe fn broadcast<B: HostMapped + ?Sized>(
    ctx: &Ctx<'_, B>,
    p: &mut Progress,
    call: Call,
    buf: *mut u8,
) -> Result<()> {
    let mut call = call;
    call.in_group(p);
    let (count, size) = (call.count, call.dtype.size());
    let is_root = ctx.me == call.root;
    if eager::fits(ctx, count * size) {
        if is_root {
            // SAFETY: `buf` holds `count` elements, within the eager limit.
            return unsafe { eager::root(ctx, p, &call, buf) };
        }
        // SAFETY: as above.
        if let eager::Arrival::Message = unsafe { eager::member(ctx, p, &call, buf)? } {
            return Ok(());
        }
        // The root runs a round: this call takes one too, which reports the disagreement.
    }
    if ll::fits(ctx, count * size) {
        // The root sends its data, the others their header alone (every member hears from
        // every peer in every round; see `ll`).
        let msg = if is_root { ll::Msg { data: buf, bytes: count * size, count } } else { ll::Msg::header(count) };
        let into = |j: usize| (j == call.root && !is_root).then_some((buf, count * size));
        // SAFETY: `buf` holds `count` elements.
        let done = unsafe { small_round(ctx, p, &call, |_| msg, into)? };
        if done {
            return Ok(());
        }
    }
    let zc = if is_root { ctx.heap_offset_of(buf, count * size) } else { None };
    let stores = Stores::for_bytes(count * size, ctx.st.tun.stream_min);
    for (c0, c) in chunks(count, ctx.st.tun.stage_bytes / size) {
        let seq = next_round(p);
        // SAFETY: the chunk lies inside `buf`.
        let here = unsafe { buf.add(c0 * size) };
        let src_off = if is_root {
            // SAFETY: the chunk lies inside `buf` and fits the workspace.
            unsafe { expose(ctx, p, zc.map(|off| off + c0 * size), here, c * size)? }
        } else {
            0
        };
        ctx.publish(seq, [src_off as i64, 0, call.sig(), count as i64, 0])?;
        agree(ctx, seq, &call, true)?;
        if !is_root {
            let mut tmp = Vec::new();
            let from = ctx.fetch(call.root, ctx.read_fact(call.root, seq, SRC) as usize, c * size, &mut tmp)?;
            // SAFETY: `from` holds the chunk; `here` is inside my buffer, disjoint from root's.
            unsafe { copy(from, here, c * size, stores) };
            fence(stores);
        }
        finish_round(ctx, p, seq, zc.is_some())?;
    }
    Ok(())
}

/// alltoall: `send[d]` (pointer, count) goes to member d; what member j sends lands at
/// `recv + displ[j]` and must be `recv_counts[j]` elements.
///
/// A member whose every piece lies in its heap lets the receivers read them in place (one copy
/// per byte); otherwise it stages its pieces through the workspace, a window per round. When
/// every member is zero-copy the call takes one round whatever the sizes.
///
/// # Safety
/// Every send pointer is valid for its count; `recv` for `sum(recv_counts)` writes at the
/// displacements; none of them overlaps another.
pub unsafe fn alltoall<B: HostMapped + ?Sized>(
    ctx: &Ctx<'_, B>,
    p: &mut Progress,
    call: Call,
    send: &[(*const u8, usize)],
    recv: *mut u8,
    recv_counts: &[usize],
) -> Result<()> {
    let mut call = call;
    call.in_group(p);
    let (n, size) = (ctx.n, call.dtype.size());
    let window = (ctx.st.tun.stage_bytes / n / size).max(1);
    let my_max = send.iter().map(|s| s.1).max().unwrap_or(0);
    // Where each member's piece lands (on the stack for small groups: no allocation per call).
    let (mut on_stack, mut on_heap) = ([0; 8], Vec::new());
    let displ = scratch(&mut on_stack, &mut on_heap, n, 0);
    let mut at = 0;
    for (d, &c) in displ.iter_mut().zip(recv_counts) {
        *d = at;
        at += c;
    }
    let displ = &*displ;
    let mismatch = |j: usize, sends: usize| Error::Mismatch {
        rank: ctx.b.rank(),
        op: ctx.op.into(),
        peer: ctx.group.ranks()[j],
        mine: format!("recv_counts[{j}] = {}", recv_counts[j]),
        theirs: format!("{sends} elements sent to group rank {}", ctx.me),
    };
    if ll::fits(ctx, my_max.max(recv_counts.iter().copied().max().unwrap_or(0)) * size) {
        let piece = |j: usize| recv.wrapping_add(displ[j] * size);
        // SAFETY: every send piece holds its count; every receive piece its `recv_counts`.
        let done = unsafe {
            ll::round(
                ctx,
                p,
                call.sig(),
                |j| ll::Msg { data: send[j].0, bytes: send[j].1 * size, count: send[j].1 },
                |j, sig, len| {
                    disagreement(ctx, &call, false, j, sig, len)
                        .or_else(|| (len as usize != recv_counts[j]).then(|| mismatch(j, len as usize)))
                },
                |j| Some((piece(j), recv_counts[j] * size)),
            )?
        };
        if done {
            if send[ctx.me].1 != recv_counts[ctx.me] {
                return Err(mismatch(ctx.me, send[ctx.me].1));
            }
            // SAFETY: my own piece: `recv_counts[me]` elements both sides, disjoint (contract).
            unsafe { copy(send[ctx.me].0, piece(ctx.me), send[ctx.me].1 * size, Stores::Cached) };
            return Ok(());
        }
    }
    // An empty piece is read by nobody: it does not make its sender stage.
    let zero_copy: Option<Vec<usize>> =
        send.iter().map(|&(ptr, len)| if len == 0 { Some(0) } else { ctx.heap_offset_of(ptr, len * size) }).collect();
    let stores = Stores::for_bytes(recv_counts.iter().sum::<usize>() * size, ctx.st.tun.stream_min);
    let mut rounds = 1usize;
    let mut all_zero_copy = false;
    let mut disagree: Option<Error> = None;
    let mut r = 0;
    while r < rounds {
        let seq = next_round(p);
        let stage_off = ctx.st.stage.heap_offset();
        if zero_copy.is_none() {
            free_stage(ctx, p)?;
            let stage = ctx.my_stage();
            for (d, &(ptr, len)) in send.iter().enumerate().filter(|&(d, _)| d != ctx.me) {
                let lo = (r * window).min(len);
                let piece = (len - lo).min(window);
                // SAFETY: the piece lies inside send[d]; slot d of the workspace holds `window`.
                unsafe { copy(ptr.add(lo * size), stage.add(d * window * size), piece * size, Stores::Cached) };
            }
        }
        for j in (0..n).filter(|&j| j != ctx.me) {
            // Each peer learns where its piece of this round is, whether I am zero-copy, and
            // what I send to it (to check against its recv_counts).
            let src = match &zero_copy {
                Some(offs) => offs[j] + (r * window).min(send[j].1) * size,
                None => stage_off + j * window * size,
            };
            let facts = [src as i64, i64::from(zero_copy.is_some()), call.sig(), send[j].1 as i64, my_max as i64];
            ctx.publish_to(j, seq, facts)?;
        }
        agree(ctx, seq, &call, false)?;
        if r == 0 {
            all_zero_copy =
                (0..n).all(|j| if j == ctx.me { zero_copy.is_some() } else { ctx.read_fact(j, seq, RED) == 1 });
            let global_max =
                (0..n).map(|j| if j == ctx.me { my_max } else { ctx.read_fact(j, seq, MAX) as usize }).max();
            rounds = if all_zero_copy { 1 } else { global_max.unwrap_or(0).div_ceil(window).max(1) };
            for j in 0..n {
                let sends = if j == ctx.me { send[j].1 } else { ctx.read_fact(j, seq, LEN) as usize };
                if sends != recv_counts[j] && disagree.is_none() {
                    disagree = Some(mismatch(j, sends));
                }
            }
        }
        if disagree.is_none() {
            let mut tmp = Vec::new();
            for j in 0..n {
                let (lo, piece) = if all_zero_copy {
                    (0, recv_counts[j])
                } else {
                    let lo = (r * window).min(recv_counts[j]);
                    (lo, (recv_counts[j] - lo).min(window))
                };
                if piece == 0 {
                    continue;
                }
                let from = if j == ctx.me {
                    // SAFETY: my own piece is send[me], `recv_counts[me]` elements (no mismatch).
                    unsafe { send[j].0.add(lo * size) }
                } else {
                    ctx.fetch(j, ctx.read_fact(j, seq, SRC) as usize, piece * size, &mut tmp)?
                };
                // SAFETY: the piece fits j's segment of `recv`; `from` holds it and is disjoint
                // from `recv` (contract for my own pieces; peers' memory otherwise).
                unsafe { copy(from, recv.add((displ[j] + lo) * size), piece * size, stores) };
            }
        }
        fence(stores);
        finish_round(ctx, p, seq, zero_copy.is_some())?;
        r += 1;
    }
    disagree.map_or(Ok(()), Err)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two-shot chunks fit the workspace (the staged chunk, and with a format the widest result
    /// part after it) in whole parts of blocks, and are not much smaller than what fits.
    #[test]
    fn two_shot_chunks_fit_the_workspace() {
        let formats = [None, Some(DType::F16), Some(DType::BF16), Some(DType::F8E4M3), Some(DType::F8E5M2)];
        for stage in [64 << 10, 256 << 10, (1 << 20) + 4096, 16 << 20] {
            for dtype in [DType::F32, DType::F64, DType::F16, DType::BF16] {
                for lp in formats {
                    for n in [1, 2, 3, 5, 8, 10, 32, 33, 64, 255, 1024] {
                        // The group's workspace, as `CollState::of` sizes it.
                        let stage = stage.max(min_stage_bytes(n));
                        assert!(
                            two_shot_fits(stage, dtype, lp, n, n * SCALE_BLOCK),
                            "workspace {stage}, {dtype} via {lp:?}, {n} ranks: one unit does not fit"
                        );
                        for count in [1, 1000, 100_003, 10_000_019] {
                            let c = two_shot_chunk(stage, dtype, lp, n, count);
                            let what = format!("workspace {stage}, {dtype} via {lp:?}, {n} ranks, count {count}");
                            assert!(two_shot_fits(stage, dtype, lp, n, c), "{what}: chunk {c}");
                            if c == count {
                                continue;
                            }
                            let unit = n * SCALE_BLOCK;
                            assert_eq!(c % unit, 0, "{what}: chunk {c}");
                            assert!(!two_shot_fits(stage, dtype, lp, n, c + unit) || c + unit >= count, "{what}: {c}");
                        }
                    }
                }
            }
        }
    }
}
