//! Small broadcasts: the root pushes its message into every member's heap and returns at once
//! (an eager protocol, as MPI's shared-memory transports use), instead of the round in which
//! every member hears from every other.
//!
//! A round costs the root a wait for every member; a small broadcast is one cache-line transfer
//! per member, so the round's wait is most of its time, and with more ranks than cores every
//! wait is a hand-over of a core. Here the root only waits when it is [`SLOTS`] broadcasts ahead
//! of a member, and a member waits only for the root's message.
//!
//! The limit is [`MAX_BYTES`] (256) where every rank has a core, and [`SHARED_MAX_BYTES`]
//! (8 KiB) where ranks outnumber cores, whose rounds cost the scheduling of every member; each
//! group sizes its slots for its limit ([`max_bytes`], the same on every member).
//!
//! # Slots
//! The `eager` buffer holds, in every member's heap, a ring of [`SLOTS`] slots per writer (the
//! root of a broadcast), written only by that writer. Broadcasts are numbered per group, the
//! same on every member (`b`, [`Progress::bcasts`] + 1 during the call); broadcast `b` from
//! root `r` uses slot `(b - 1) % SLOTS` of `r`'s ring: its flag word (set last, to `b`, through
//! the backend's `signal_at`, which orders the stores before it and wakes a sleeping reader),
//! the root's call signature, the count, and the data, on as few lines as the size allows.
//!
//! # Flow control
//! On entering broadcast `b` a member publishes `EAGER_WAIT = b` (with its signature in
//! `EAGER_SIG`, written first) in its record on the root (on every peer when the root's message
//! is not there yet and it is about to wait, since its peers may then look for it, below): it
//! has finished broadcast `b - 1`, so it reads no slot of an earlier broadcast again. A root
//! overwrites the slot of broadcast `b - SLOTS` only once the member's `EAGER_WAIT` in its own
//! heap has reached `b - SLOTS + 1`; it reads that word only when the value it saw last is too
//! old (once per [`SLOTS`] broadcasts at most in a steady stream). A root may thus wait for a
//! member that has finished the broadcasts in between under other roots, until that member
//! enters the root's broadcast and announces it there, which it does before it waits for
//! anything: no cycle.
//!
//! # Agreement, and what the root does not learn
//! The member compares the root's signature and count with its own (a mismatch fails the
//! member, naming both). While it waits for the root's message it also watches for evidence
//! that the root is not sending: the root's round-protocol or small-message flag of the next
//! round (the root runs another collective: the member then runs the round protocol for this
//! call, which reports the disagreement to both), the root's `EAGER_WAIT` for this broadcast
//! (the root believes it is a member: both disagree on the root, or the root rejected its
//! arguments), or a message for this broadcast from another writer (that member believes it
//! is the root). So members that disagree fail instead of waiting out the timeout: when some
//! member believes it is the root, its message reaches every other member; when none does,
//! every member waits, and so announces itself on every peer. The root,
//! which never waits for the members, does not learn of a disagreement in the call: its call
//! succeeds, as an eager MPI send does, and the members report it. Its next collective of the
//! group learns it (see [`wait`](super::wait)): a member that found the disagreement has
//! published it, or a peer's message for the same broadcast shows another self-declared root
//! (so where every member that disagrees names itself the root, and nobody waits, each finds the
//! others' messages). A member in another collective learns of a root's broadcast from the
//! root's message for the group's next small broadcast, in its waits. Round-protocol calls carry the group's
//! broadcast count in their signature, so members that disagree on how many broadcasts were
//! made fail at their next collective. A member that ends up running the call as a round takes
//! its announcement back (`EAGER_WAIT = b - 1`), so that no peer reads it as its part in the
//! group's next small broadcast; every other outcome, errors included, counts the broadcast on
//! that member. A rank that rejects its own arguments ([`reject`]) announces itself with
//! signature -1 first, then joins whichever way its peers went.
//!
//! Whether a call takes this path depends only on its size in bytes, which members agree on
//! when the program is correct; a member whose count differs from the root's across the limit
//! runs the round protocol while the root returns, and fails when the root's next round-based
//! call shows the disagreement, or at the timeout.

use std::sync::atomic::{AtomicI64, Ordering};

use super::algo::{mismatch, Call};
use super::ll;
use super::state::{fast_spins, ready, Ctx, Flag, LastBcast, Progress, EAGER_LEN, EAGER_SIG, EAGER_WAIT};
use symm_core::backend::{HostMapped, SignalWidth};
use symm_core::error::Result;
use symm_core::op::SignalOp;

/// Largest broadcast (bytes) sent eagerly where every rank has a core. Above it the
/// small-message round is ahead: the eager path copies twice, into the slot and out of it (see
/// docs/performance-log.md, "Eager small broadcasts").
pub const MAX_BYTES: usize = 256;
/// Largest broadcast sent eagerly where ranks outnumber cores ([`Backend::waiters_share_cores`]).
/// There every round costs the scheduling of every member, while an eager broadcast costs the
/// root its copies (one per member) and each member one wait; at 32 KiB the copies would cost
/// more than the round (docs/performance-log.md, "Eager small broadcasts"). The largest
/// `SYMM_BCAST_EAGER_MAX` the configuration accepts: the slots are sized for it.
pub const SHARED_MAX_BYTES: usize = symm_core::config::BCAST_EAGER_LIMIT;
/// Broadcasts a root may run ahead of a member: the slots of a writer's ring. Where ranks share
/// cores the ring is as deep: a shallower ring makes the root wait for its members often
/// enough to double a small broadcast's time (docs/performance-log.md, "Eager small
/// broadcasts"), so a group of `n` members there holds `n` rings of 516 KiB in every member's
/// heap (20 KiB otherwise).
pub const SLOTS: usize = 64;
/// A slot's words before its data: flag, signature, count.
const HEADER: usize = 24;

/// The eager limit of a group whose members share cores or not: the same on every member (a
/// property of the host and the job's ranks on it), as the path a call takes must be.
pub fn max_bytes(shared_cores: bool) -> usize {
    if shared_cores {
        SHARED_MAX_BYTES
    } else {
        MAX_BYTES
    }
}

/// Bytes of a slot for messages of up to `max` bytes: whole cache lines, so that slots never
/// share a line.
const fn slot_bytes(max: usize) -> usize {
    (HEADER + max).next_multiple_of(64)
}
/// How many broadcasts ahead a root takes its slot's lines for writing ([`own_ahead`]).
const OWN_AHEAD: u64 = 8;
const _: () = assert!(OWN_AHEAD < SLOTS as u64);

/// Asks for the lines of `[slot, slot + bytes)` (a root's slot in a peer's heap, written a few
/// broadcasts from now) in the exclusive state (`prefetchw`).
///
/// Every small broadcast writes a slot whose lines the member has read a ring ago, so each
/// write first takes its line back from the member's cache, and where the two cores sit far
/// apart the store waits for it. Taken eight broadcasts ahead, the line is there when the store
/// comes (docs/performance-log.md, "The root takes its slots' lines ahead"). The member
/// usually loses nothing: it finished with the slot's previous broadcast long ago; one more
/// than `SLOTS - OWN_AHEAD` broadcasts behind (flow control allows up to [`SLOTS`]) fetches the
/// line back when it reads it. `slot` need not be valid: a prefetch never faults and changes no
/// data.
#[inline]
fn own_ahead(slot: *mut u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..bytes).step_by(64) {
        // SAFETY: `prefetchw` (PRFCHW, executed as a no-op where absent) is a hint: it reads
        // and writes no register or memory and cannot fault.
        unsafe {
            std::arch::asm!(
                "prefetchw [{0}]",
                in(reg) slot.wrapping_add(line),
                options(nostack, readonly, preserves_flags)
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (slot, bytes);
}

/// Reads of the root's flag between two looks at the evidence that it is not sending.
const LOOK_EVERY: u32 = 16;

/// Bytes of the `eager` buffer of a group of `n` members, with limit `max` ([`max_bytes`]).
pub const fn buffer_bytes(n: usize, max: usize) -> usize {
    n * ring_bytes(max)
}

/// Bytes of one writer's ring (what a writer touches in each peer's heap).
pub const fn ring_bytes(max: usize) -> usize {
    SLOTS * slot_bytes(max)
}

/// Whether a broadcast of `bytes` takes this path (members agree when their calls agree).
pub fn fits<B: HostMapped + ?Sized>(ctx: &Ctx<'_, B>, bytes: usize) -> bool {
    bytes <= ctx.st.eager_max
}

/// Heap offset of `writer`'s slot for broadcast `b` (the same in every member's heap).
fn slot_offset<B: HostMapped + ?Sized>(ctx: &Ctx<'_, B>, writer: usize, b: u64) -> usize {
    ctx.st.eager.heap_offset() + (writer * SLOTS + ((b - 1) as usize % SLOTS)) * slot_bytes(ctx.st.eager_max)
}

/// The flag of `writer`'s message for broadcast `b` in the caller's heap.
pub(super) fn message(ctx: &Ctx<'_, impl HostMapped + ?Sized>, writer: usize, b: u64) -> Flag {
    Flag { writer, offset: slot_offset(ctx, writer, b), value: b, what: "broadcast message" }
}

/// `writer`'s `EAGER_WAIT` for broadcast `b`: reached once it is a member of broadcast `b` (or
/// of a later one).
fn waiting(ctx: &Ctx<'_, impl HostMapped + ?Sized>, writer: usize, b: u64) -> Flag {
    Flag { writer, offset: ctx.word_offset(writer, EAGER_WAIT), value: b, what: "broadcast member" }
}

/// The root's part of broadcast `p.bcasts + 1` (`call`): its `count` elements at `data` to every
/// member.
///
/// # Safety
/// `data` is valid for `call.count` elements of reads, within the group's limit ([`fits`]).
pub unsafe fn root<B: HostMapped + ?Sized>(
    ctx: &Ctx<'_, B>,
    p: &mut Progress,
    call: &Call,
    data: *const u8,
) -> Result<()> {
    let (sig, count, bytes) = (call.sig(), call.count, call.count * call.dtype.size());
    debug_assert!(fits(ctx, bytes));
    let b = p.bcasts + 1;
    // Counted whatever the outcome, as the members count it.
    p.bcasts = b;
    p.last_bcast = Some(LastBcast { root: ctx.me, sig, count });
    // Without mapped peers: the slot's words after its flag, put with the flag (built once; an
    // empty `Vec` allocates nothing).
    let mut staged = Vec::new();
    if ctx.mapped.is_none() {
        staged.reserve_exact(HEADER - 8 + bytes);
        staged.extend_from_slice(&sig.to_le_bytes());
        staged.extend_from_slice(&(count as u64).to_le_bytes());
        // SAFETY: `data` holds `bytes` (contract).
        staged.extend_from_slice(unsafe { std::slice::from_raw_parts(data, bytes) });
    }
    for j in (0..ctx.n).filter(|&j| j != ctx.me) {
        // The slot last held broadcast b - SLOTS at most: free once j has entered the one after.
        let free_from = (b + 1).saturating_sub(SLOTS as u64);
        if p.eager_seen[j] < free_from {
            p.eager_seen[j] = ctx.read_word(j, EAGER_WAIT) as u64;
            if p.eager_seen[j] < free_from {
                ctx.wait_word(j, EAGER_WAIT, free_from, "broadcast member")?;
                p.eager_seen[j] = ctx.read_word(j, EAGER_WAIT) as u64;
            }
        }
        let off = slot_offset(ctx, ctx.me, b);
        let peer = ctx.group.ranks()[j];
        match ctx.mapped {
            Some(bases) => {
                let slot = bases[j].0.wrapping_add(off);
                // SAFETY: the slot lies inside member j's `eager` buffer, in its mapped heap,
                // 64-aligned (buffers are granule-aligned); j reads it only after the flag set
                // below, and no more reads the broadcast it held before (flow control above).
                // `data` holds `bytes` (contract), which the slot holds after its header.
                unsafe {
                    let words = slot.cast::<u64>();
                    words.add(1).write(sig as u64);
                    words.add(2).write(count as u64);
                    std::ptr::copy_nonoverlapping(data, slot.add(HEADER), bytes);
                }
                // The backend orders the stores above before the flag (a release), and wakes j
                // if it sleeps.
                ctx.b.signal_at(peer, off, SignalWidth::W64, SignalOp::Set, b as i64)?;
                own_ahead(bases[j].0.wrapping_add(slot_offset(ctx, ctx.me, b + OWN_AHEAD)), HEADER + bytes);
            }
            None => {
                // SAFETY: `staged` lives across the call; the words and data fit the slot after
                // its flag, in member j's `eager` buffer (flow control above).
                unsafe {
                    ctx.b.put_signal_bytes(
                        peer,
                        off + 8,
                        staged.as_ptr(),
                        staged.len(),
                        off,
                        SignalWidth::W64,
                        SignalOp::Set,
                        b as i64,
                    )?
                };
            }
        }
    }
    Ok(())
}

/// What a member found while waiting for the root's message.
pub enum Arrival {
    /// The message is in the caller's heap.
    Message,
    /// The root runs a round of the round protocol or of the small-message path: the caller
    /// runs this call that way too (nothing was counted), and the round reports the
    /// disagreement.
    Rounds,
}

/// A member's part of broadcast `p.bcasts + 1` (`call`): copies the root's message into `dst`,
/// after checking that the root was asked the same (signature and count).
///
/// # Safety
/// `dst` is valid for `call.count` elements of writes, within the group's limit ([`fits`]).
pub unsafe fn member<B: HostMapped + ?Sized>(
    ctx: &Ctx<'_, B>,
    p: &mut Progress,
    call: &Call,
    dst: *mut u8,
) -> Result<Arrival> {
    let (sig, count, bytes) = (call.sig(), call.count, call.count * call.dtype.size());
    debug_assert!(fits(ctx, bytes));
    let b = p.bcasts + 1;
    // The root needs it (flow control); the others only when this member waits (below).
    announce(ctx, b, sig, count, Some(call.root))?;
    // Counted from here, errors included: every member counts the broadcast, whatever its
    // outcome, so that peers keep agreeing on the count.
    p.bcasts = b;
    let before = p.last_bcast.replace(LastBcast { root: call.root, sig, count });
    let f = message(ctx, call.root, b);
    if !f.reached(ctx) {
        // About to wait: every peer may look for it (see `arrival`, `reject`).
        announce(ctx, b, sig, count, None)?;
        if let Arrival::Rounds = arrival(ctx, p, call, f, b)? {
            // Not a small broadcast after all: taken back, so that no peer reads this
            // announcement as this member's part in the group's next small broadcast.
            (p.bcasts, p.last_bcast) = (b - 1, before);
            announce(ctx, b - 1, sig, count, None)?;
            return Ok(Arrival::Rounds);
        }
    }
    let slot = ctx.base.wrapping_add(f.offset);
    let (theirs, their_count) = sent(ctx, f);
    if theirs != sig || their_count != count as i64 {
        return Err(mismatch(ctx, call, call.root, theirs, their_count));
    }
    // SAFETY: as above; the root sent `bytes` (its count and signature, hence its dtype,
    // agree); `dst` holds `bytes` (contract).
    unsafe { std::ptr::copy_nonoverlapping(slot.add(HEADER), dst, bytes) };
    // The root's next message usually goes to the next slot: fetch its lines while the caller
    // runs (it reads them shared; the root takes them back when it writes).
    #[cfg(target_arch = "x86_64")]
    {
        let next = ctx.base.wrapping_add(slot_offset(ctx, call.root, b + 1));
        for line in (0..HEADER + bytes).step_by(64) {
            // SAFETY: a prefetch is only a hint; the address lies in the caller's heap.
            unsafe {
                std::arch::x86_64::_mm_prefetch(next.wrapping_add(line).cast::<i8>(), std::arch::x86_64::_MM_HINT_T0)
            };
        }
    }
    Ok(Arrival::Message)
}

/// The signature and count a writer sent with message `f`, which has arrived (`f` reached).
pub(super) fn sent<B: HostMapped + ?Sized>(ctx: &Ctx<'_, B>, f: Flag) -> (i64, i64) {
    let words = ctx.base.wrapping_add(f.offset).cast::<i64>();
    // SAFETY: the writer's slot in the caller's heap; its words were written before the flag
    // seen (acquire), and the writer rewrites the slot only after this member has entered a
    // later broadcast.
    unsafe { (words.add(1).read(), words.add(2).read()) }
}

/// Publishes `EAGER_WAIT = b`, after the caller's signature and count (`EAGER_SIG`,
/// `EAGER_LEN`), in the caller's record on member `to`, or on every peer (`None`). `sig` -1: the
/// caller rejected its arguments.
fn announce<B: HostMapped + ?Sized>(ctx: &Ctx<'_, B>, b: u64, sig: i64, count: usize, to: Option<usize>) -> Result<()> {
    let (facts_at, wait_at) = (ctx.word_offset(ctx.me, EAGER_SIG), ctx.word_offset(ctx.me, EAGER_WAIT));
    const _: () = assert!(EAGER_LEN == EAGER_SIG + 1);
    for j in (0..ctx.n).filter(|&j| j != ctx.me && to.is_none_or(|t| t == j)) {
        let peer = ctx.group.ranks()[j];
        match ctx.mapped {
            Some(bases) => {
                // SAFETY: the words lie in the caller's record of member j's flags buffer,
                // mapped, 8-aligned; only the caller writes them, and peers read them
                // atomically (a peer may read the previous announcement's words meanwhile).
                let words = unsafe { &*bases[j].0.wrapping_add(facts_at).cast::<[AtomicI64; 2]>() };
                // Relaxed: `EAGER_WAIT`, set below with release semantics, publishes them.
                words[0].store(sig, Ordering::Relaxed);
                words[1].store(count as i64, Ordering::Relaxed);
                ctx.b.signal_at(peer, wait_at, SignalWidth::W64, SignalOp::Set, b as i64)?;
            }
            None => {
                let mut facts = [0u8; 16];
                facts[..8].copy_from_slice(&sig.to_le_bytes());
                facts[8..].copy_from_slice(&(count as i64).to_le_bytes());
                // SAFETY: `facts` lives across the call; the destination is the caller's record on j.
                unsafe {
                    ctx.b.put_signal_bytes(
                        peer,
                        facts_at,
                        facts.as_ptr(),
                        16,
                        wait_at,
                        SignalWidth::W64,
                        SignalOp::Set,
                        b as i64,
                    )?
                };
            }
        }
    }
    Ok(())
}

/// Waits for `f` (the root's message for broadcast `b`), watching for evidence that the root is
/// not sending it (see the module documentation).
fn arrival<B: HostMapped + ?Sized>(ctx: &Ctx<'_, B>, p: &Progress, call: &Call, f: Flag, b: u64) -> Result<Arrival> {
    let root = f.writer;
    let next = p.seq + 1;
    let rounds = Flag { writer: root, offset: ctx.word_offset(root, ready(next)), value: next, what: "ready" };
    let small = ctx.mapped.map(|_| ll::header_flag(ctx, root, next));
    let root_waits = waiting(ctx, root, b);
    // Every sign that the root is not sending is read before its message: the root may have
    // sent it and gone on (into a round, or into a later broadcast as a member, which it then
    // announces), and what it did before is visible once what it did after is (acquire). Signs
    // seen with the message there mean nothing.
    let judge = || -> Result<Option<Arrival>> {
        let round = rounds.reached(ctx) || small.is_some_and(|s| s.reached(ctx));
        let root_waited = root_waits.reached(ctx);
        let other = (0..ctx.n).find(|&y| y != ctx.me && y != root && message(ctx, y, b).reached(ctx));
        if f.reached(ctx) {
            return Ok(Some(Arrival::Message));
        }
        if root_waited {
            let (theirs, len) = (ctx.read_word(root, EAGER_SIG), ctx.read_word(root, EAGER_LEN));
            return Err(mismatch(ctx, call, root, theirs, len));
        }
        if let Some(y) = other {
            let (theirs, len) = sent(ctx, message(ctx, y, b));
            return Err(mismatch(ctx, call, y, theirs, len));
        }
        Ok(round.then_some(Arrival::Rounds))
    };
    let fast = fast_spins(ctx.b);
    for spin in 1..=fast {
        if f.reached(ctx) {
            return Ok(Arrival::Message);
        }
        if spin % LOOK_EVERY == 0 {
            if let Some(a) = judge()? {
                return Ok(a);
            }
        }
    }
    let mut flags = vec![f, rounds, root_waits];
    flags.extend(small);
    flags.extend((0..ctx.n).filter(|&y| y != ctx.me && y != root).map(|y| message(ctx, y, b)));
    // For a timeout: the members that have entered this broadcast.
    let arrived = |k: usize| ctx.read_word(k, EAGER_WAIT) >= b as i64;
    loop {
        ctx.wait_any(&flags, &arrived)?;
        if let Some(a) = judge()? {
            return Ok(a);
        }
    }
}

/// A broadcast that rejected its own arguments (`reject`). Its peers may run the call as a
/// small broadcast, which has no round to join: this rank announces the broadcast with
/// signature -1 (a member waiting for it as its root fails with `PeerRejected`), then looks
/// which way the peers went. When some run it as a small broadcast (a root's message, or a
/// member's announcement) it counts the broadcast as they do and returns true; when some run a
/// round, or every peer rejected its arguments too, it returns false and the caller joins the
/// round (every rejecting member then does).
pub fn reject<B: HostMapped + ?Sized>(ctx: &Ctx<'_, B>, p: &mut Progress) -> Result<bool> {
    /// What a peer's flag shows when it is reached.
    #[derive(Clone, Copy, PartialEq)]
    enum Sign {
        /// The peer runs a round.
        Round,
        /// The peer entered the small broadcast, as a member or rejecting it too.
        Entered,
        /// The peer sent its message as the small broadcast's root.
        Sent,
    }
    let (b, next) = (p.bcasts + 1, p.seq + 1);
    announce(ctx, b, -1, 0, None)?;
    // The round: this announcement is taken back (as a member's, see `member`).
    let join_round = || announce(ctx, b - 1, -1, 0, None).map(|()| false);
    let mut watch = Vec::new();
    for j in (0..ctx.n).filter(|&j| j != ctx.me) {
        watch.push((
            Flag { writer: j, offset: ctx.word_offset(j, ready(next)), value: next, what: "ready" },
            Sign::Round,
        ));
        watch.extend(ctx.mapped.map(|_| (ll::header_flag(ctx, j, next), Sign::Round)));
        watch.push((waiting(ctx, j, b), Sign::Entered));
        watch.push((message(ctx, j, b), Sign::Sent));
    }
    let mut rejecting = 0;
    loop {
        // Read before the signs of a small broadcast: a peer's round may follow its part in one
        // (a root returns at once), and what it did before is visible once its round is.
        let round = watch.iter().any(|(f, sign)| *sign == Sign::Round && f.reached(ctx));
        let mut k = 0;
        while k < watch.len() {
            let (f, sign) = watch[k];
            if sign == Sign::Round || !f.reached(ctx) {
                k += 1;
            } else if sign == Sign::Entered && ctx.read_word(f.writer, EAGER_SIG) == -1 {
                // It rejected its arguments too: no sign of the others' way; watched no more.
                rejecting += 1;
                watch.remove(k);
            } else {
                p.bcasts = b;
                // The root, where its message shows it (a member's announcement does not).
                p.last_bcast = (sign == Sign::Sent).then(|| {
                    let (sig, count) = sent(ctx, f);
                    LastBcast { root: f.writer, sig, count: count as usize }
                });
                return Ok(true);
            }
        }
        // A peer that runs a round waits for this rank's part in it.
        if round || rejecting == ctx.n - 1 {
            return join_round();
        }
        let flags: Vec<Flag> = watch.iter().map(|w| w.0).collect();
        ctx.wait_any(&flags, &|j| watch.iter().any(|(f, _)| f.writer == j && f.reached(ctx)))?;
    }
}
