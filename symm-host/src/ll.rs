//! Small messages: each writer stores its message straight into the reader's heap, with one
//! flag per message set last (the idea of NCCL's "LL" protocols, with the CPU's ordering doing
//! what LL's per-line flags do on a GPU). A small round then costs the message's line transfers
//! and one flag on its critical path, where the round protocol of [`state`](super::state) costs
//! a flag, a staging copy, the read of the staged data, and a DONE flag.
//!
//! # Slots
//! The `ll` buffer holds, in every member's heap, two slots per writer (even and odd rounds)
//! of [`SLOT_BYTES`], written only by that writer, with direct stores into the mapped heap (this
//! path needs the backend's mapping of peers' heaps). Line 0 of a slot is the header: its flag
//! (word 0, the round number of the message), the writer's call signature and a count (what the
//! round protocol's facts carry), then the first [`HEAD_DATA`] bytes of the message; the rest of
//! the message follows from line 1 on, contiguous. The writer stores the data past the header
//! line, then the header line, then the flag through the backend's `signal_at` (release, and
//! a wake for a reader asleep in a blocking wait). A reader waits for the flag (acquire), which
//! makes every line of the message visible, and copies the message out.
//!
//! NCCL's LL protocols put a flag beside every 8 bytes (LL) or 120 bytes (LL128) because a GPU
//! reader checks each piece as it lands and a GPU's stores to different lines may land out of
//! order. A reader here waits for one flag, whose release/acquire pair orders every line before
//! it, so a message carries no other flag: flags on every line cost more than their bytes (see
//! docs/performance-log.md, "The small-message path and its limit").
//!
//! # A round
//! Every member sends one message to every other member (its data, or the header line alone
//! when it has nothing for that member), then waits for every peer's header, compares
//! signatures and counts, then copies the messages out. Each member hears from every peer in
//! every round, which keeps the invariant the round protocol relies on ("Rounds follow each
//! other" in [`state`](super::state)): a writer reuses a slot two rounds later, when its reader
//! has finished the round that used it, so no DONE flag is needed.
//!
//! # Mixing with the round protocol
//! Whether a member takes this path depends on its own arguments and environment (sizes, the
//! transport format, `SYMM_LL_MAX`), which members may not share: when they disagree (a
//! mismatch; a rejected argument, which runs a round-protocol round) and, legitimately, in
//! alltoall, where a member knows only its own counts. A member on the round protocol
//! publishes `READY` for the round instead of a header; a member waiting for headers watches
//! both words, and on seeing a `READY` gives the round number back and runs the round
//! protocol for the same round. Every member on this path waits for that member too, so they
//! all switch; the round protocol then completes the call, or reports the disagreement on
//! every member.

use super::state::{fast_spins, ready, Ctx, Flag, Progress, SendPtr};
use symm_core::backend::{HostMapped, SignalWidth};
use symm_core::error::{Error, Result};
use symm_core::op::SignalOp;

#[cfg(all(test, loom))]
mod model;

/// Bytes of a line (a cache line on the CPUs measured).
const LINE: usize = 64;
/// Message bytes on line 0, after its flag, signature and count words.
const HEAD_DATA: usize = 40;
const HEAD_DATA_AT: usize = 24;
// Every dtype's elements (1 to 8 bytes) stay whole in the header line, and the data past it
// starts on a line of its own.
const _: () = assert!(HEAD_DATA.is_multiple_of(8) && HEAD_DATA_AT + HEAD_DATA == LINE);
const _: () = assert!(DEFAULT_MAX_BYTES <= MAX_BYTES);
/// Largest message of one writer to one reader (bytes): what a slot holds, the largest
/// `SYMM_LL_MAX` the configuration accepts.
pub const MAX_BYTES: usize = symm_core::config::LL_LIMIT;
/// Default of `SYMM_LL_MAX`. Up to about 2 KiB a message's few lines arrive faster this way;
/// beyond, the writer's stores into lines the reader holds (each an ownership transfer, and
/// glibc's `memcpy` switches to `rep movsb`, slow into such lines) cost more than the reader's
/// read of a copy staged or read in place (docs/performance-log.md, "The small-message path and
/// its limit").
pub const DEFAULT_MAX_BYTES: usize = symm_core::config::LL_DEFAULT_MAX_BYTES;
/// Bytes of one slot: the header line, then room for the rest of the largest message.
const SLOT_BYTES: usize = LINE + (MAX_BYTES - HEAD_DATA).next_multiple_of(LINE);
// Every byte of the largest message has a place in a slot, and slots stay line-aligned.
const _: () = assert!(HEAD_DATA + (SLOT_BYTES - LINE) >= MAX_BYTES && SLOT_BYTES.is_multiple_of(LINE));
/// Reads of a header flag between two looks at the writer's round-protocol flag.
const LOOK_EVERY: u32 = 16;

/// Bytes of the `ll` buffer of a group of `n` members.
pub const fn buffer_bytes(n: usize) -> usize {
    n * 2 * SLOT_BYTES
}

/// Heap offset of `writer`'s slot for round `seq` (the same in every member's heap).
fn slot_offset<B: HostMapped + ?Sized>(ctx: &Ctx<'_, B>, writer: usize, seq: u64) -> usize {
    ctx.st.ll.heap_offset() + (writer * 2 + (seq % 2) as usize) * SLOT_BYTES
}

/// The flag of `writer`'s message header for round `seq` in the caller's heap.
pub fn header_flag<B: HostMapped + ?Sized>(ctx: &Ctx<'_, B>, writer: usize, seq: u64) -> Flag {
    Flag { writer, offset: slot_offset(ctx, writer, seq), value: seq, what: "small-message" }
}

/// Whether a call moving at most `bytes` per pair of members may take this path: the backend
/// maps peers' heaps, and the size is within `SYMM_LL_MAX`.
pub fn fits<B: HostMapped + ?Sized>(ctx: &Ctx<'_, B>, bytes: usize) -> bool {
    ctx.mapped.is_some() && bytes <= ctx.st.tun.ll_max
}

/// One member's message to another: `bytes` at `data` (none: the header alone), and the count
/// the reader checks.
#[derive(Clone, Copy, Debug)]
pub struct Msg {
    pub data: *const u8,
    pub bytes: usize,
    pub count: usize,
}

impl Msg {
    /// The header alone, announcing `count`.
    pub fn header(count: usize) -> Msg {
        Msg { data: std::ptr::null(), bytes: 0, count }
    }
}

/// What a peer sent for a round.
enum Head {
    /// A message: its writer's signature and count.
    Small { sig: i64, count: i64 },
    /// The peer runs the round protocol for this round.
    Rounds,
}

/// One round on this path: sends `msg(j)` to every peer `j`, waits for every peer's header and
/// lets `check(j, sig, count)` judge it, then copies each peer's data to where `into(j)` says
/// (pointer and bytes, the bytes the caller expects; `None`: nothing to read). Returns false
/// when a peer runs the round protocol for this round: the round number is given back, nothing
/// was written to the caller's memory, and the caller runs the round protocol.
///
/// # Safety
/// `ctx.mapped` is set (see [`fits`]); every `msg(j)` is valid for its bytes (at most
/// [`MAX_BYTES`]), every `into(j)` for its bytes of writes (at most [`MAX_BYTES`]); what
/// `check` accepts has `into`'s sizes.
pub unsafe fn round<B: HostMapped + ?Sized>(
    ctx: &Ctx<'_, B>,
    p: &mut Progress,
    sig: i64,
    msg: impl Fn(usize) -> Msg,
    check: impl Fn(usize, i64, i64) -> Option<Error>,
    into: impl Fn(usize) -> Option<(*mut u8, usize)>,
) -> Result<bool> {
    let Some(bases) = ctx.mapped else {
        return Ok(false);
    };
    p.seq += 1;
    let seq = p.seq;
    let peers = || (0..ctx.n).filter(|&j| j != ctx.me);
    for j in peers() {
        // SAFETY: forwarded (message size and validity).
        unsafe { send(ctx, bases, j, seq, sig, msg(j))? };
    }
    let mut bad = None;
    for j in peers() {
        match head(ctx, j, seq)? {
            Head::Rounds => {
                p.seq -= 1;
                return Ok(false);
            }
            Head::Small { sig, count } => {
                if bad.is_none() {
                    bad = check(j, sig, count);
                }
            }
        }
    }
    // Reported only now: every peer's header has been seen, so every peer has finished the
    // round before (see the module documentation) and the group stays usable.
    if let Some(e) = bad {
        return Err(e);
    }
    for j in peers() {
        if let Some((dst, bytes)) = into(j) {
            // SAFETY: forwarded; the writer sent `bytes` (checked above).
            unsafe { body(ctx, j, seq, dst, bytes) };
        }
    }
    Ok(true)
}

/// Writes `m` into member `j`'s copy of the caller's slot for round `seq`: the data past the
/// header line first, then the header line, whose flag goes last.
///
/// # Safety
/// `m.data` is valid for `m.bytes <= MAX_BYTES` reads; `bases` are the members' mapped heaps.
unsafe fn send<B: HostMapped + ?Sized>(
    ctx: &Ctx<'_, B>,
    bases: &[SendPtr],
    j: usize,
    seq: u64,
    sig: i64,
    m: Msg,
) -> Result<()> {
    debug_assert!(m.bytes <= MAX_BYTES);
    let off = slot_offset(ctx, ctx.me, seq);
    let slot = bases[j].0.wrapping_add(off);
    // SAFETY: the slot lies inside member j's `ll` buffer, in its mapped heap, 64-aligned
    // (buffers are granule-aligned) and SLOT_BYTES long (room for MAX_BYTES); j reads it only
    // after the header's flag written below (release), and reads the previous message in this
    // slot no more (module documentation). `m.data` holds `m.bytes` (contract).
    unsafe {
        if m.bytes > HEAD_DATA {
            std::ptr::copy_nonoverlapping(m.data.add(HEAD_DATA), slot.add(LINE), m.bytes - HEAD_DATA);
        }
        let words = slot.cast::<u64>();
        words.add(1).write(sig as u64);
        words.add(2).write(m.count as u64);
        if m.bytes > 0 {
            std::ptr::copy_nonoverlapping(m.data, slot.add(HEAD_DATA_AT), m.bytes.min(HEAD_DATA));
        }
    }
    // The flag, last: the backend orders every store above before it (release), and wakes a
    // reader asleep in a blocking wait.
    ctx.b.signal_at(ctx.group.ranks()[j], off, SignalWidth::W64, SignalOp::Set, seq as i64)
}

/// Waits for member `j`'s header of round `seq`, or its round-protocol `READY` for the round.
fn head<B: HostMapped + ?Sized>(ctx: &Ctx<'_, B>, j: usize, seq: u64) -> Result<Head> {
    let small = header_flag(ctx, j, seq);
    let off = small.offset;
    let rounds = Flag { writer: j, offset: ctx.word_offset(j, ready(seq)), value: seq, what: "ready" };
    let (mut spins, fast) = (0u32, fast_spins(ctx.b));
    while !small.reached(ctx) {
        spins += 1;
        if spins % LOOK_EVERY == 0 && rounds.reached(ctx) {
            return Ok(Head::Rounds);
        }
        if spins >= fast {
            // Members that sent either for this round have arrived.
            let arrived = |k: usize| {
                ctx.read_at(slot_offset(ctx, k, seq)) >= seq as i64 || ctx.read_word(k, ready(seq)) >= seq as i64
            };
            ctx.wait_any(&[small, rounds], &arrived)?;
            if !small.reached(ctx) {
                return Ok(Head::Rounds);
            }
            break;
        }
    }
    let line = ctx.base.wrapping_add(off).cast::<i64>();
    // SAFETY: line 0 of j's slot in the caller's heap; its words were written before the flag
    // seen above (acquire), and j writes the slot again only two rounds later.
    let (sig, count) = unsafe { (line.add(1).read(), line.add(2).read()) };
    Ok(Head::Small { sig, count })
}

/// Copies member `j`'s message of round `seq` (`bytes`, as its header said) to `dst`. Every
/// line of it was written before the header's flag, which [`head`] saw (acquire).
///
/// # Safety
/// `dst` is valid for `bytes` writes; j's header for the round announced `bytes`.
unsafe fn body<B: HostMapped + ?Sized>(ctx: &Ctx<'_, B>, j: usize, seq: u64, dst: *mut u8, bytes: usize) {
    if bytes == 0 {
        return; // `dst` may be the null pointer of an empty buffer
    }
    let slot = ctx.base.wrapping_add(slot_offset(ctx, j, seq));
    // SAFETY: j's slot in the caller's heap, written before the flag seen; j writes it again
    // only two rounds later (module documentation); `dst` holds `bytes`.
    unsafe {
        std::ptr::copy_nonoverlapping(slot.add(HEAD_DATA_AT), dst, bytes.min(HEAD_DATA));
        if bytes > HEAD_DATA {
            std::ptr::copy_nonoverlapping(slot.add(LINE), dst.add(HEAD_DATA), bytes - HEAD_DATA);
        }
    }
}
