//! Small messages: every byte travels on a cache line together with a flag (after NCCL's "LL"
//! protocols), so a reader that sees a line's flag has the line's data in the same transfer.
//! A small round then costs one line transfer per 56 bytes on its critical path, where the
//! round protocol of [`state`](super::state) costs a flag, a staging copy, the read of the
//! staged data, and a DONE flag.
//!
//! # Slots
//! The `ll` buffer holds, in every member's heap, two slots per writer (even and odd rounds)
//! of [`SLOT_BYTES`], written only by that writer, with direct stores into the mapped heap (this
//! path needs the backend's mapping of peers' heaps). A slot is a run of 64-byte lines; word 0
//! of every line is its flag: the round number of the message the line carries. Line 0 also
//! carries what the round protocol's facts carry (the writer's call signature and a count),
//! then [`HEAD_DATA`] bytes of the message; every further line [`BODY_DATA`] bytes. The writer
//! stores a line's data, then its flag (release), line by line; the last flag of a message goes
//! through the backend's `signal_at`, which also wakes a reader asleep in a blocking wait. A
//! reader waits for line 0 (the header: the size it announces decides which line is last),
//! then for the last line, which orders every line before it.
//!
//! # A round
//! Every member sends one message to every other member (its data, or the header line alone
//! when it has nothing for that member), then waits for every peer's header, compares
//! signatures and counts, then reads the data lines. Each member hears from every peer in
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

use std::sync::atomic::{AtomicU64, Ordering};

use super::state::{fast_spins, ready, Ctx, Flag, Progress, SendPtr};
use crate::backend::{Backend, SignalWidth};
use crate::error::{Error, Result};
use crate::op::SignalOp;

/// Bytes of a line (a cache line on the CPUs measured).
const LINE: usize = 64;
/// Message bytes on line 0, after its flag, signature and count words.
const HEAD_DATA: usize = 40;
const HEAD_DATA_AT: usize = 24;
/// Message bytes on every further line, after its flag.
const BODY_DATA: usize = 56;
const BODY_DATA_AT: usize = 8;
// Every dtype's elements (1 to 8 bytes) stay whole on a line.
const _: () = assert!(HEAD_DATA % 8 == 0 && BODY_DATA % 8 == 0 && HEAD_DATA_AT + HEAD_DATA == LINE);
const _: () = assert!(DEFAULT_MAX_BYTES <= MAX_BYTES);
/// Largest message of one writer to one reader (bytes): the slot size.
pub const MAX_BYTES: usize = 4096;
/// Default of `SYMM_LL_MAX`. Up to about 2 KiB a message's few lines arrive faster this way;
/// beyond, the writer's stores into lines the reader holds (each an ownership transfer) cost
/// more than the reader's streaming read of a staged copy (measured on 2 ranks: 4 KiB takes
/// 1.2-1.3 us here against 1.0-1.1 us through the round protocol).
pub const DEFAULT_MAX_BYTES: usize = 2048;
/// Bytes of one slot.
const SLOT_BYTES: usize = lines(MAX_BYTES) * LINE;
/// Reads of a header flag between two looks at the writer's round-protocol flag.
const LOOK_EVERY: u32 = 16;

/// Lines of a message of `bytes`.
const fn lines(bytes: usize) -> usize {
    if bytes <= HEAD_DATA {
        1
    } else {
        1 + (bytes - HEAD_DATA).div_ceil(BODY_DATA)
    }
}

/// Bytes of the `ll` buffer of a group of `n` members.
pub const fn buffer_bytes(n: usize) -> usize {
    n * 2 * SLOT_BYTES
}

/// Heap offset of `writer`'s slot for round `seq` (the same in every member's heap).
fn slot_offset<B: Backend + ?Sized>(ctx: &Ctx<'_, B>, writer: usize, seq: u64) -> usize {
    ctx.st.ll.heap_offset() + (writer * 2 + (seq % 2) as usize) * SLOT_BYTES
}

/// The flag of `writer`'s message header for round `seq` in the caller's heap.
pub fn header_flag<B: Backend + ?Sized>(ctx: &Ctx<'_, B>, writer: usize, seq: u64) -> Flag {
    Flag { writer, offset: slot_offset(ctx, writer, seq), value: seq, what: "small-message" }
}

/// Whether a call moving at most `bytes` per pair of members may take this path: the backend
/// maps peers' heaps, and the size is within `SYMM_LL_MAX`.
pub fn fits<B: Backend + ?Sized>(ctx: &Ctx<'_, B>, bytes: usize) -> bool {
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
pub unsafe fn round<B: Backend + ?Sized>(
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
            unsafe { body(ctx, j, seq, dst, bytes)? };
        }
    }
    Ok(true)
}

/// The flag word of a line.
///
/// # Safety
/// `line` is the start of a line of a slot, 8-aligned, in a live heap mapping.
unsafe fn flag<'a>(line: *mut u8) -> &'a AtomicU64 {
    // SAFETY: caller's contract; flags are only accessed atomically.
    unsafe { &*line.cast::<AtomicU64>() }
}

/// Writes `m` into member `j`'s copy of the caller's slot for round `seq`.
///
/// # Safety
/// `m.data` is valid for `m.bytes <= MAX_BYTES` reads; `bases` are the members' mapped heaps.
unsafe fn send<B: Backend + ?Sized>(
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
    let n = lines(m.bytes);
    // SAFETY: the slot lies inside member j's `ll` buffer, in its mapped heap, 64-aligned
    // (buffers are granule-aligned); j reads it only after the line flags written below
    // (release), and reads the previous message in this slot no more (module documentation).
    // `m.data` holds `m.bytes` (contract).
    unsafe {
        let words = slot.cast::<u64>();
        words.add(1).write(sig as u64);
        words.add(2).write(m.count as u64);
        if m.bytes > 0 {
            std::ptr::copy_nonoverlapping(m.data, slot.add(HEAD_DATA_AT), m.bytes.min(HEAD_DATA));
        }
    }
    for i in 0..n {
        let line = slot.wrapping_add(i * LINE);
        if i > 0 {
            let at = HEAD_DATA + (i - 1) * BODY_DATA;
            // SAFETY: as above; `at < m.bytes` since the message has line i.
            unsafe { copy_part(m.data.add(at), line.add(BODY_DATA_AT), m.bytes - at) };
        }
        if i + 1 < n {
            // Release: the line's data (and the header words) are visible before its flag.
            // SAFETY: `line` starts a line of the slot.
            unsafe { flag(line) }.store(seq, Ordering::Release);
        } else {
            // The last flag wakes a reader that sleeps (the backend orders the stores above
            // before it).
            ctx.b.signal_at(ctx.group.ranks()[j], off + i * LINE, SignalWidth::W64, SignalOp::Set, seq as i64)?;
        }
    }
    Ok(())
}

/// Copies the data of one body line: [`BODY_DATA`] bytes, or `left` when fewer are left.
///
/// # Safety
/// `src` and `dst` are valid for `min(left, BODY_DATA)` bytes and do not overlap.
#[inline(always)]
unsafe fn copy_part(src: *const u8, dst: *mut u8, left: usize) {
    // SAFETY: caller's contract. A full line is a copy of constant size, which the compiler
    // inlines as a few vector moves (a call to memcpy per line would cost more than the line).
    unsafe {
        if left >= BODY_DATA {
            std::ptr::copy_nonoverlapping(src, dst, BODY_DATA);
        } else {
            std::ptr::copy_nonoverlapping(src, dst, left);
        }
    }
}

/// Waits for member `j`'s header of round `seq`, or its round-protocol `READY` for the round.
fn head<B: Backend + ?Sized>(ctx: &Ctx<'_, B>, j: usize, seq: u64) -> Result<Head> {
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

/// Copies member `j`'s message of round `seq` (`bytes`, as its header said) to `dst`.
///
/// Waits for the flag of the message's last line only: the writer sets it last, with release
/// semantics, so seeing it (acquire) makes every earlier line visible too. Polling each line
/// instead would pull lines the writer is still writing back and forth between the two cores.
///
/// # Safety
/// `dst` is valid for `bytes` writes; j's header for the round announced `bytes`.
unsafe fn body<B: Backend + ?Sized>(ctx: &Ctx<'_, B>, j: usize, seq: u64, dst: *mut u8, bytes: usize) -> Result<()> {
    let off = slot_offset(ctx, j, seq);
    let slot = ctx.base.wrapping_add(off);
    let n = lines(bytes);
    if n > 1 {
        let last = (n - 1) * LINE;
        let f = Flag { writer: j, offset: off + last, value: seq, what: "small-message" };
        if !f.reached(ctx) {
            ctx.wait_flag(f, &|k| slot_offset(ctx, k, seq) + last)?;
        }
    }
    // SAFETY: j's slot in the caller's heap, every line written before the flags seen (acquire)
    // by `head` and above; `dst` holds `bytes`.
    unsafe {
        std::ptr::copy_nonoverlapping(slot.add(HEAD_DATA_AT), dst, bytes.min(HEAD_DATA));
        for i in 1..n {
            let at = HEAD_DATA + (i - 1) * BODY_DATA;
            copy_part(slot.add(i * LINE + BODY_DATA_AT), dst.add(at), bytes - at);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_hold_the_message() {
        assert_eq!(lines(0), 1);
        assert_eq!(lines(HEAD_DATA), 1);
        assert_eq!(lines(HEAD_DATA + 1), 2);
        assert_eq!(lines(HEAD_DATA + BODY_DATA), 2);
        assert_eq!(lines(HEAD_DATA + BODY_DATA + 1), 3);
        // Every byte of the largest message has a place in a slot.
        let n = lines(MAX_BYTES);
        assert!(HEAD_DATA + (n - 1) * BODY_DATA >= MAX_BYTES && n * LINE == SLOT_BYTES);
    }
}
