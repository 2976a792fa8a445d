//! send / recv / sendrecv: ordered, flow-controlled messages through per-sender mailboxes, and
//! zero-copy rendezvous for large messages from the symmetric heap.
//!
//! # Eager messages
//! The receiver's `mail` buffer has one mailbox per sender, [`MAIL_SLOTS`] chunks deep. The
//! sender writes chunk `k` (counting from 1 per pair, over all messages) into slot
//! `(k - 1) % MAIL_SLOTS` once the receiver has acknowledged chunk `k - MAIL_SLOTS`, then sets
//! `SENT = k` in its record on the receiver (a put-with-signal: the chunk is visible first).
//! The receiver waits for `SENT >= k`, copies the chunk out and sets `ACK = k` in its record
//! on the sender. So a small message is delivered without the receiver being in `recv` (up to
//! [`MAIL_SLOTS`] chunks are buffered), a large one streams, and messages between one pair
//! arrive in order.
//!
//! Each chunk starts with a header (the message's total bytes and dtype), so a `recv` whose
//! buffer does not match the message fails with both sizes named, after consuming the message
//! (the pair stays usable).
//!
//! # Rendezvous (zero-copy)
//! A message larger than the mailbox holds ([`eager_max_bytes`]) whose buffer lies in the
//! sender's symmetric heap travels as a single chunk, a *descriptor*: its header's dtype word
//! carries [`RENDEZVOUS`] and its payload the buffer's heap offset. The receiver copies the
//! whole message straight from the sender's heap into its own buffer (direct loads when the
//! backend maps peers' heaps, `get` otherwise) and then acknowledges the descriptor like any
//! chunk; the sender returns only after that `ACK`, since the receiver reads its buffer in
//! place. One copy of every byte instead of two. A mismatching receiver acknowledges the
//! descriptor without copying (the sender is released; the receiver fails naming both sizes).
//!
//! The threshold keeps which programs complete unchanged: a message that fits the mailbox is
//! always eager, so its send still returns without the receiver; a larger one needed the
//! receiver inside `recv` before its send could return anyway (flow control).
//!
//! # sendrecv
//! One send and one receive that progress together (MPI_Sendrecv): the outgoing message is
//! posted first (as many eager chunks as free slots allow, or the descriptor), then the call
//! alternates between consuming incoming chunks that have arrived and pushing outgoing chunks
//! whose slots the peer has freed, waiting (on both words at once, see [`wait_any`]) only when
//! neither can move. Neither direction waits for the other, so any sizes and any pairing
//! (rings, pairwise exchanges, a peer using plain `send`/`recv` in either order) complete. Its
//! send is an ordinary message for the receiver and its receive takes any message: plain and
//! combined calls mix freely, and order between a pair is kept.

use std::time::{Duration, Instant};

use super::copy::{copy, fence, Stores};
use super::state::{Ctx, Progress, Tunables, ACK, MAIL_HEADER, MAIL_SLOTS, SENT};
use crate::backend::{Backend, SignalWidth};
use crate::dtype::DType;
use crate::error::{Error, Result, TimeoutError};
use crate::op::SignalOp;

/// Flag in a chunk header's dtype word: the chunk is a rendezvous descriptor, whose payload is
/// the heap offset of the message in the sender's heap. Dtype codes are below 256, so the flag
/// never collides with one.
const RENDEZVOUS: i64 = 1 << 32;

/// Reads of the awaited words between two looks at the clock in [`wait_any`].
const FAST_POLLS: u32 = 512;
/// How long [`wait_any`] polls both words before it blocks, when every rank has a core / when
/// waiters share cores (as the backend reports): the CPU backend's spin budget and yield window. With a
/// core of its own the poller spins (a `sched_yield` costs about a microsecond, which a small
/// message would pay at every poll); sharing its core, it hands the core over at every poll,
/// but the peers it waits for run sooner once it sleeps.
const POLL_FOR: Duration = Duration::from_millis(2);
const POLL_FOR_SHARED: Duration = Duration::from_micros(200);
/// First and largest slice of one word's blocking wait in [`wait_any`]: a change of the other
/// word is noticed at the end of the slice at the latest.
const FIRST_SLICE: Duration = Duration::from_millis(1);
const MAX_SLICE: Duration = Duration::from_millis(16);
/// Every this long without progress, [`wait_any`] blocks for one [`HEALTH_SLICE`], long
/// enough for the backend's periodic check that the awaited peer is still there (every 100 ms
/// of sleep in `symm-sim`): a peer that died fails the wait with `PeerLost` instead of the
/// timeout.
const HEALTH_EVERY: Duration = Duration::from_secs(1);
const HEALTH_SLICE: Duration = Duration::from_millis(150);

/// Largest message (bytes) sent eagerly whatever its buffer: what the mailbox of one pair
/// holds. Larger messages whose send buffer lies in the sender's symmetric heap go rendezvous
/// (zero-copy); larger ones from other memory stream through the mailbox.
pub fn eager_max_bytes(tun: &Tunables) -> usize {
    MAIL_SLOTS * (tun.mail_chunk - MAIL_HEADER)
}

fn slot_offset<B: Backend + ?Sized>(ctx: &Ctx<'_, B>, sender: usize, k: u64) -> usize {
    let chunk = ctx.st.tun.mail_chunk;
    ctx.st.mail.heap_offset() + (sender * MAIL_SLOTS + ((k - 1) as usize % MAIL_SLOTS)) * chunk
}

fn chunks_of(bytes: usize, payload: usize) -> usize {
    bytes.div_ceil(payload).max(1)
}

/// Whether `writer`'s word `word` in the caller's copy has reached `value` (never waits).
fn reached<B: Backend + ?Sized>(ctx: &Ctx<'_, B>, writer: usize, word: usize, value: u64) -> bool {
    // `read_word` is an acquire load: what the writer made visible before the word (a chunk
    // before SENT; its last read of a slot or of a rendezvous buffer before ACK) is ordered
    // before what the caller does next.
    ctx.read_word(writer, word) >= value as i64
}

/// The sending half of a call: one message to member `dst`.
struct Outgoing {
    buf: *const u8,
    bytes: usize,
    dst: usize,
    /// Chunk header: total bytes, dtype code (with [`RENDEZVOUS`] for a descriptor).
    header: [u8; MAIL_HEADER],
    /// Chunks pushed so far, and in all (a rendezvous pushes one: the descriptor).
    pushed: usize,
    chunks: usize,
    /// Rendezvous: the buffer's offset in the caller's heap.
    rendezvous: Option<usize>,
    /// Chunk number of the pushed descriptor until the receiver acknowledges it (the buffer
    /// is read in place until then).
    awaiting: Option<u64>,
}

impl Outgoing {
    fn new<B: Backend + ?Sized>(ctx: &Ctx<'_, B>, buf: *const u8, bytes: usize, dtype: DType, dst: usize) -> Self {
        let payload = ctx.st.tun.mail_chunk - MAIL_HEADER;
        let rendezvous = if bytes > eager_max_bytes(&ctx.st.tun) { ctx.heap_offset_of(buf, bytes) } else { None };
        let dtype_word = i64::from(dtype.code()) | if rendezvous.is_some() { RENDEZVOUS } else { 0 };
        let mut header = [0u8; MAIL_HEADER];
        header[..8].copy_from_slice(&(bytes as i64).to_le_bytes());
        header[8..].copy_from_slice(&dtype_word.to_le_bytes());
        let chunks = if rendezvous.is_some() { 1 } else { chunks_of(bytes, payload) };
        Outgoing { buf, bytes, dst, header, pushed: 0, chunks, rendezvous, awaiting: None }
    }

    fn done(&self) -> bool {
        self.pushed == self.chunks && self.awaiting.is_none()
    }

    /// Whether eager chunks remain to push (slots freed by the peer let them go).
    fn pushing(&self) -> bool {
        self.pushed < self.chunks
    }

    /// The `ACK` value from `dst` the next step needs, and what it is, or `None` when done.
    fn need(&self, p: &Progress) -> Option<(u64, &'static str)> {
        if self.pushing() {
            // Slot of chunk k is free once chunk k - MAIL_SLOTS is acknowledged.
            Some(((p.sent[self.dst] + 1).saturating_sub(MAIL_SLOTS as u64), "mailbox acknowledgement"))
        } else {
            self.awaiting.map(|k| (k, "rendezvous acknowledgement"))
        }
    }

    /// Pushes the chunks free slots allow and notes the descriptor's acknowledgement; never
    /// waits. Returns whether anything moved.
    ///
    /// # Safety
    /// `buf` is valid for `bytes` reads until [`Outgoing::done`].
    unsafe fn step<B: Backend + ?Sized>(&mut self, ctx: &Ctx<'_, B>, p: &mut Progress) -> Result<bool> {
        let payload = ctx.st.tun.mail_chunk - MAIL_HEADER;
        let peer = ctx.group.ranks()[self.dst];
        let mut moved = false;
        while self.pushing() {
            let k = p.sent[self.dst] + 1;
            if k > MAIL_SLOTS as u64 && !reached(ctx, self.dst, ACK, k - MAIL_SLOTS as u64) {
                break;
            }
            let slot = slot_offset(ctx, ctx.me, k);
            if let Some(offset) = self.rendezvous {
                // The descriptor: header and heap offset in one put, then SENT.
                let mut desc = [0u8; MAIL_HEADER + 8];
                desc[..MAIL_HEADER].copy_from_slice(&self.header);
                desc[MAIL_HEADER..].copy_from_slice(&(offset as u64).to_le_bytes());
                // SAFETY: `desc` lives across the call; it fits slot `k` of my mailbox on `dst`
                // (chunks hold at least a header and 64 payload bytes).
                unsafe {
                    ctx.b.put_signal_bytes(
                        peer,
                        slot,
                        desc.as_ptr(),
                        desc.len(),
                        ctx.word_offset(ctx.me, SENT),
                        SignalWidth::W64,
                        SignalOp::Set,
                        k as i64,
                    )?;
                }
                self.awaiting = Some(k);
            } else {
                let lo = self.pushed * payload;
                let len = (self.bytes - lo).min(payload);
                // SAFETY: the header and the chunk lie inside slot `k` of my mailbox on `dst`
                // (chunk size = header + payload); `buf` holds `bytes` (contract),
                // `lo + len <= bytes`.
                unsafe {
                    ctx.b.put_bytes(peer, slot, self.header.as_ptr(), MAIL_HEADER)?;
                    ctx.b.put_signal_bytes(
                        peer,
                        slot + MAIL_HEADER,
                        self.buf.add(lo),
                        len,
                        ctx.word_offset(ctx.me, SENT),
                        SignalWidth::W64,
                        SignalOp::Set,
                        k as i64,
                    )?;
                }
            }
            p.sent[self.dst] = k;
            self.pushed += 1;
            moved = true;
        }
        if let Some(k) = self.awaiting {
            if reached(ctx, self.dst, ACK, k) {
                self.awaiting = None;
                moved = true;
            }
        }
        Ok(moved)
    }
}

/// A rendezvous message being copied from the sender's heap.
struct Pull {
    /// Chunk number of its descriptor (acknowledged once the copy is complete).
    k: u64,
    /// Offset of the message in the sender's heap.
    offset: usize,
    /// Bytes copied so far.
    copied: usize,
}

/// The receiving half of a call: the next message from member `src`.
struct Incoming {
    buf: *mut u8,
    bytes: usize,
    dtype: DType,
    src: usize,
    /// Chunks consumed, and the message's chunks (1 until its first chunk is seen).
    consumed: usize,
    chunks: usize,
    pull: Option<Pull>,
    /// The message does not match the buffer: it is consumed, then this is the result.
    mismatch: Option<Error>,
}

impl Incoming {
    fn new(buf: *mut u8, bytes: usize, dtype: DType, src: usize) -> Self {
        Incoming { buf, bytes, dtype, src, consumed: 0, chunks: 1, pull: None, mismatch: None }
    }

    fn done(&self) -> bool {
        self.consumed == self.chunks
    }

    /// The `SENT` value from `src` the next step needs; `None` when done or when a
    /// rendezvous copy can go on without waiting.
    fn need(&self, p: &Progress) -> Option<u64> {
        (!self.done() && self.pull.is_none()).then(|| p.received[self.src] + 1)
    }

    /// Consumes the chunks that have arrived, or copies up to `piece` bytes of a rendezvous
    /// message (then returns, so that a caller with a send in progress can serve it between
    /// pieces); never waits. Returns whether anything moved.
    ///
    /// # Safety
    /// `buf` is valid for `bytes` writes until [`Incoming::done`].
    unsafe fn step<B: Backend + ?Sized>(&mut self, ctx: &Ctx<'_, B>, p: &mut Progress, piece: usize) -> Result<bool> {
        let payload = ctx.st.tun.mail_chunk - MAIL_HEADER;
        let base = ctx.b.local_heap_base();
        let mut moved = false;
        loop {
            if let Some(pull) = &mut self.pull {
                let len = (self.bytes - pull.copied).min(piece.max(1));
                let stores = Stores::for_bytes(self.bytes, ctx.st.tun.stream_min);
                // SAFETY: sizes agree (checked on the descriptor), so the range lies inside
                // `buf` and inside the sender's buffer, which it does not touch before our ACK.
                unsafe {
                    copy_from_peer(ctx, self.src, pull.offset + pull.copied, self.buf.add(pull.copied), len, stores)?
                };
                pull.copied += len;
                if pull.copied == self.bytes {
                    fence(stores);
                    let k = pull.k;
                    self.pull = None;
                    p.received[self.src] = k;
                    self.consumed += 1;
                    // After the last read of the sender's buffer: the signal is a release
                    // (SeqCst store), so the sender may reuse its buffer once it sees it.
                    ctx.signal(self.src, ACK, k)?;
                }
                return Ok(true);
            }
            if self.done() {
                return Ok(moved);
            }
            let k = p.received[self.src] + 1;
            if !reached(ctx, self.src, SENT, k) {
                return Ok(moved);
            }
            moved = true;
            let slot = base.wrapping_add(slot_offset(ctx, self.src, k));
            // SAFETY: the slot lies in my mail buffer; the sender wrote it before SENT
            // (acquired by `reached`) and will not rewrite it before my ACK.
            let (msg_bytes, dtype_word) =
                unsafe { (slot.cast::<i64>().read_unaligned() as usize, slot.add(8).cast::<i64>().read_unaligned()) };
            if self.consumed == 0 {
                let rendezvous = dtype_word & RENDEZVOUS != 0;
                let msg_dtype = dtype_word & !RENDEZVOUS;
                self.chunks = if rendezvous { 1 } else { chunks_of(msg_bytes, payload) };
                if msg_bytes != self.bytes || msg_dtype != i64::from(self.dtype.code()) {
                    let theirs_dtype = DType::from_code(msg_dtype).map_or_else(|_| "?".to_string(), |d| d.to_string());
                    self.mismatch = Some(Error::Mismatch {
                        rank: ctx.b.rank(),
                        op: ctx.op.into(),
                        peer: ctx.group.ranks()[self.src],
                        mine: format!("recv of {} elements of {}", self.bytes / self.dtype.size(), self.dtype),
                        theirs: format!("a message of {msg_bytes} bytes of {theirs_dtype}"),
                    });
                } else if rendezvous {
                    // SAFETY: the descriptor's payload (8 bytes) follows the header in the slot.
                    let offset = unsafe { slot.add(MAIL_HEADER).cast::<u64>().read_unaligned() } as usize;
                    self.pull = Some(Pull { k, offset, copied: 0 });
                    continue;
                }
            }
            if self.mismatch.is_none() {
                let lo = self.consumed * payload;
                let len = (self.bytes - lo).min(payload);
                // SAFETY: `lo + len <= bytes` (sizes agree); the chunk's payload follows the
                // header.
                unsafe { std::ptr::copy_nonoverlapping(slot.add(MAIL_HEADER), self.buf.add(lo), len) };
            }
            // A mismatching message is consumed all the same, a descriptor included, so that
            // its sender is released and the pair stays usable.
            p.received[self.src] = k;
            self.consumed += 1;
            ctx.signal(self.src, ACK, k)?;
        }
    }

    fn finish(self) -> Result<()> {
        self.mismatch.map_or(Ok(()), Err)
    }
}

/// Copies `len` bytes at `offset` of member `j`'s heap to `dst`: direct loads when peers'
/// heaps are mapped (and loads allowed), with `stores` (the caller fences streaming ones),
/// `get` otherwise.
///
/// # Safety
/// `dst` is valid for `len` writes and does not overlap the source, unless `j` is the caller
/// itself (then any overlap is tolerated); the source range lies in `j`'s heap.
unsafe fn copy_from_peer<B: Backend + ?Sized>(
    ctx: &Ctx<'_, B>,
    j: usize,
    offset: usize,
    dst: *mut u8,
    len: usize,
    stores: Stores,
) -> Result<()> {
    if j == ctx.me {
        // SAFETY: inside the caller's own heap (contract); `copy` tolerates overlap.
        unsafe { std::ptr::copy(ctx.b.local_heap_base().add(offset), dst, len) };
        return Ok(());
    }
    match ctx.mapped {
        // SAFETY: member j's heap is mapped at `bases[j]`; the range is inside it (contract).
        Some(bases) => unsafe { copy(bases[j].0.add(offset), dst, len, stores) },
        // SAFETY: forwarded from this function's contract.
        None => unsafe { ctx.b.get_bytes(ctx.group.ranks()[j], offset, dst, len)? },
    }
    Ok(())
}

/// Sends `bytes` bytes at `buf` (elements of `dtype`) to member `dst`.
///
/// # Safety
/// `buf` is valid for `bytes` reads.
pub unsafe fn send<B: Backend + ?Sized>(
    ctx: &Ctx<'_, B>,
    p: &mut Progress,
    buf: *const u8,
    bytes: usize,
    dtype: DType,
    dst: usize,
) -> Result<()> {
    let mut out = Outgoing::new(ctx, buf, bytes, dtype, dst);
    loop {
        // SAFETY: forwarded from this function's contract.
        unsafe { out.step(ctx, p)? };
        match out.need(p) {
            None => return Ok(()),
            Some((value, what)) => ctx.wait_word(dst, ACK, value, what)?,
        }
    }
}

/// Receives a message of exactly `bytes` bytes (elements of `dtype`) from member `src`.
///
/// # Safety
/// `buf` is valid for `bytes` writes.
pub unsafe fn recv<B: Backend + ?Sized>(
    ctx: &Ctx<'_, B>,
    p: &mut Progress,
    buf: *mut u8,
    bytes: usize,
    dtype: DType,
    src: usize,
) -> Result<()> {
    let mut inc = Incoming::new(buf, bytes, dtype, src);
    loop {
        // Nothing else to serve: a rendezvous message is copied in one piece.
        // SAFETY: forwarded from this function's contract.
        unsafe { inc.step(ctx, p, usize::MAX)? };
        if inc.done() {
            return inc.finish();
        }
        if let Some(k) = inc.need(p) {
            ctx.wait_word(src, SENT, k, "mailbox")?;
        }
    }
}

/// Sends `send_bytes` at `send_buf` to member `dst` and receives the next message from member
/// `src` (exactly `recv_bytes` of `recv_dtype`) into `recv_buf`, both at once (see the
/// module's documentation). A mismatching incoming message is consumed and reported after the
/// send is complete.
///
/// # Safety
/// `send_buf` is valid for `send_bytes` reads and `recv_buf` for `recv_bytes` writes; they do
/// not overlap.
#[allow(clippy::too_many_arguments)] // one send's and one receive's arguments
pub unsafe fn sendrecv<B: Backend + ?Sized>(
    ctx: &Ctx<'_, B>,
    p: &mut Progress,
    send_buf: *const u8,
    send_bytes: usize,
    send_dtype: DType,
    dst: usize,
    recv_buf: *mut u8,
    recv_bytes: usize,
    recv_dtype: DType,
    src: usize,
) -> Result<()> {
    let mut out = Outgoing::new(ctx, send_buf, send_bytes, send_dtype, dst);
    let mut inc = Incoming::new(recv_buf, recv_bytes, recv_dtype, src);
    // While eager chunks still wait for slots, an incoming rendezvous is copied a mailbox's
    // worth at a time, so that the slots the peer frees meanwhile are refilled between pieces;
    // otherwise in one piece.
    let piece = eager_max_bytes(&ctx.st.tun);
    loop {
        // SAFETY: forwarded from this function's contract.
        let mut moved = unsafe { out.step(ctx, p)? };
        let limit = if out.pushing() { piece } else { usize::MAX };
        // SAFETY: forwarded from this function's contract.
        moved |= unsafe { inc.step(ctx, p, limit)? };
        if out.done() && inc.done() {
            return inc.finish();
        }
        if moved {
            continue;
        }
        let outgoing = out.need(p).map(|(value, what)| Need { writer: dst, word: ACK, value, what });
        let incoming = inc.need(p).map(|value| Need { writer: src, word: SENT, value, what: "mailbox" });
        match (outgoing, incoming) {
            (Some(a), Some(b)) => wait_any(ctx, [a, b])?,
            (Some(n), None) | (None, Some(n)) => ctx.wait_word(n.writer, n.word, n.value, n.what)?,
            // Unreachable: a call not done needs a word or can move without one.
            (None, None) => {}
        }
    }
}

/// A condition a point-to-point call waits for: `writer`'s word `word` at least `value`.
#[derive(Clone, Copy, Debug)]
struct Need {
    writer: usize,
    word: usize,
    value: u64,
    what: &'static str,
}

/// Waits until either of two words reaches its value, without ever blocking on one alone for
/// long (the other direction of a sendrecv may need service while the first stays quiet).
///
/// Both words are polled, spinning while each rank has a core, yielding the core between
/// polls where the backend says waiters share cores ([`Backend::waiters_share_cores`]: the
/// peers run meanwhile), for [`POLL_FOR`] ([`POLL_FOR_SHARED`] when sharing); after that the
/// wait blocks on
/// each word in turn for a slice (1 ms doubling up to 16 ms, once per second of silence one
/// [`HEALTH_SLICE`] so that the backend notices a lost peer), so an idle call sleeps instead of
/// burning a core and a change of the other word is seen within a slice. The whole wait is
/// bounded by the call's timeout; its error names both words.
fn wait_any<B: Backend + ?Sized>(ctx: &Ctx<'_, B>, needs: [Need; 2]) -> Result<()> {
    let met = || needs.iter().any(|n| reached(ctx, n.writer, n.word, n.value));
    let start = Instant::now();
    let deadline = start + ctx.timeout;
    let shared = ctx.b.waiters_share_cores();
    let poll_for = if shared { POLL_FOR_SHARED } else { POLL_FOR };
    let mut polls = 0u32;
    loop {
        if met() {
            return Ok(());
        }
        polls += 1;
        if shared && polls >= FAST_POLLS {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
        if polls % FAST_POLLS == 0 && start.elapsed() >= poll_for {
            break;
        }
    }
    let mut slice = FIRST_SLICE;
    let mut next_health = start + HEALTH_EVERY;
    for turn in 0.. {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        let this = if now >= next_health {
            next_health = now + HEALTH_EVERY;
            HEALTH_SLICE
        } else {
            let s = slice;
            slice = (slice * 2).min(MAX_SLICE);
            s
        };
        let n = needs[turn % 2];
        // The same wait as any other, bounded by the slice: a slice that runs out is no error.
        let bounded = Ctx { timeout: this.min(deadline - now), ..*ctx };
        match bounded.wait_word(n.writer, n.word, n.value, n.what) {
            Ok(()) => return Ok(()),
            Err(Error::Timeout(_)) => {}
            Err(e) => return Err(e),
        }
        if met() {
            return Ok(());
        }
    }
    Err(timeout_any(ctx, &needs, start.elapsed()))
}

/// The timeout of [`wait_any`]: who waited for which two words, and what it saw last.
fn timeout_any<B: Backend + ?Sized>(ctx: &Ctx<'_, B>, needs: &[Need], waited: Duration) -> Error {
    let ranks = ctx.group.ranks();
    let join = |f: &dyn Fn(&Need) -> String| needs.iter().map(f).collect::<Vec<_>>().join(" / ");
    let mut pending: Vec<_> = needs.iter().map(|n| ranks[n.writer]).collect();
    pending.dedup();
    let mut t = TimeoutError::new(
        ctx.b.rank(),
        format!("{} (either direction)", ctx.op),
        Some(ranks.to_vec()),
        join(&|n| format!("the {} flag of group rank {} (global rank {})", n.what, n.writer, ranks[n.writer])),
        join(&|n| format!("signal >= {}", n.value)),
        join(&|n| ctx.read_word(n.writer, n.word).to_string()),
        pending,
        waited,
    );
    t.sequence = Some(ctx.call);
    Error::Timeout(Box::new(t))
}
