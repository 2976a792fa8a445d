//! send / recv / sendrecv: ordered, flow-controlled messages through per-sender mailboxes, and
//! zero-copy rendezvous for large messages from the symmetric heap.
//!
//! # Eager messages
//! The receiver's `mail` buffer has one mailbox per sender, [`MAIL_SLOTS`] chunks deep. The
//! sender writes chunk `k` (counting from 1 per pair, over all messages) into slot
//! `(k - 1) % MAIL_SLOTS` once the receiver has acknowledged chunk `k - MAIL_SLOTS`, then sets
//! the slot's flag, its first word, to `k` (a put-with-signal: the chunk is visible first).
//! The receiver waits for the flag to reach `k`, copies the chunk out and sets `ACK = k` in its
//! record on the sender. So a small message is delivered without the receiver being in `recv`
//! (up to [`MAIL_SLOTS`] chunks are buffered), a large one streams, and messages between one
//! pair arrive in order. The flag shares its cache line with the chunk's header and, for
//! messages of up to 256 bytes, the first 40 bytes of payload: a receiver that sees the flag of
//! a small message has the message in the same transfer. Larger messages start their payload on
//! the slot's second line, so that their copies run on whole lines. A sender reads the receiver's `ACK` only when the value it saw last does not free
//! the slot it needs.
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
//! whose slots the peer has freed, waiting (on both words at once, see [`Ctx::wait_any`]) only when
//! neither can move. Neither direction waits for the other, so any sizes and any pairing
//! (rings, pairwise exchanges, a peer using plain `send`/`recv` in either order) complete. Its
//! send is an ordinary message for the receiver and its receive takes any message: plain and
//! combined calls mix freely, and order between a pair is kept.

use super::state::{Ctx, Flag, Progress, Tunables, ACK, MAIL_HEADER, MAIL_SLOTS};
use symm_core::backend::{HostMapped, SignalWidth};
use symm_core::coll::copy::{copy, fence, Stores};
use symm_core::dtype::DType;
use symm_core::error::{Error, Result};
use symm_core::op::SignalOp;

/// Flag in a chunk header's dtype word: the chunk is a rendezvous descriptor, whose payload is
/// the heap offset of the message in the sender's heap. Dtype codes are below 256, so the flag
/// never collides with one.
const RENDEZVOUS: i64 = 1 << 32;

/// Largest message (bytes) sent eagerly whatever its buffer: what the mailbox of one pair
/// holds. Larger messages whose send buffer lies in the sender's symmetric heap go rendezvous
/// (zero-copy); larger ones from other memory stream through the mailbox.
pub fn eager_max_bytes(tun: &Tunables) -> usize {
    MAIL_SLOTS * payload_of(tun, usize::MAX)
}

fn slot_offset<B: HostMapped + ?Sized>(ctx: &Ctx<'_, B>, sender: usize, k: u64) -> usize {
    let chunk = ctx.st.tun.mail_chunk;
    ctx.st.mail.heap_offset() + (sender * MAIL_SLOTS + ((k - 1) as usize % MAIL_SLOTS)) * chunk
}

fn chunks_of(bytes: usize, payload: usize) -> usize {
    // Most messages fit one chunk: spare them a 64-bit division (tens of cycles) per call.
    if bytes <= payload {
        return 1;
    }
    bytes.div_ceil(payload)
}

/// Where the header (total bytes, dtype word) of a chunk starts in its slot, after the flag.
const HEADER_AT: usize = 8;
/// Bytes of the header.
const HEADER_BYTES: usize = MAIL_HEADER - HEADER_AT;
/// Messages up to this size carry their payload right after the header, on the flag's line (a
/// message of up to 40 bytes arrives in one line transfer); larger ones from the slot's second
/// line on, so that copying in and out stores and loads whole aligned lines (a vector store
/// that crosses two lines costs two; docs/performance-log.md, "Send/recv"). Both ends know a
/// message's size (the sender its own, the receiver from the header).
const INLINE_MAX: usize = 256;
/// Where a rendezvous descriptor's heap offset lies in its slot: right after the header.
const DESCRIPTOR_AT: usize = MAIL_HEADER;
const _: () = assert!(HEADER_AT + HEADER_BYTES == DESCRIPTOR_AT);

/// Where the payload of a chunk of a message of `bytes` starts in its slot.
const fn payload_at(bytes: usize) -> usize {
    if bytes <= INLINE_MAX {
        MAIL_HEADER
    } else {
        64
    }
}

/// Payload bytes of one chunk of a message of `bytes`.
fn payload_of(tun: &Tunables, bytes: usize) -> usize {
    tun.mail_chunk - payload_at(bytes)
}

/// The flag of chunk `k` from `sender` (in the caller's mailbox): reached once the chunk is
/// there.
fn arrival<B: HostMapped + ?Sized>(ctx: &Ctx<'_, B>, sender: usize, k: u64) -> Flag {
    Flag { writer: sender, offset: slot_offset(ctx, sender, k), value: k, what: "mailbox" }
}

/// Whether `dst` has acknowledged chunk `k` of the caller's: from the value seen last, else
/// from its `ACK` word (an acquire load: its last read of the slot or of a rendezvous buffer
/// is ordered before what the caller does next).
fn acked<B: HostMapped + ?Sized>(ctx: &Ctx<'_, B>, p: &mut Progress, dst: usize, k: u64) -> bool {
    if p.acked[dst] < k {
        p.acked[dst] = ctx.read_word(dst, ACK) as u64;
    }
    p.acked[dst] >= k
}

/// The sending half of a call: one message to member `dst`.
struct Outgoing {
    buf: *const u8,
    bytes: usize,
    dst: usize,
    /// Chunk header: total bytes, dtype code (with [`RENDEZVOUS`] for a descriptor).
    header: [u8; HEADER_BYTES],
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
    fn new<B: HostMapped + ?Sized>(ctx: &Ctx<'_, B>, buf: *const u8, bytes: usize, dtype: DType, dst: usize) -> Self {
        let payload = payload_of(&ctx.st.tun, bytes);
        let rendezvous = if bytes > eager_max_bytes(&ctx.st.tun) { ctx.heap_offset_of(buf, bytes) } else { None };
        let dtype_word = i64::from(dtype.code()) | if rendezvous.is_some() { RENDEZVOUS } else { 0 };
        let mut header = [0u8; HEADER_BYTES];
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
    unsafe fn step<B: HostMapped + ?Sized>(&mut self, ctx: &Ctx<'_, B>, p: &mut Progress) -> Result<bool> {
        let (at, payload) = (payload_at(self.bytes), payload_of(&ctx.st.tun, self.bytes));
        let peer = ctx.group.ranks()[self.dst];
        let mut moved = false;
        while self.pushing() {
            let k = p.sent[self.dst] + 1;
            if k > MAIL_SLOTS as u64 && !acked(ctx, p, self.dst, k - MAIL_SLOTS as u64) {
                break;
            }
            let slot = slot_offset(ctx, ctx.me, k);
            if let Some(offset) = self.rendezvous {
                // The descriptor: header and heap offset in one put, then the flag.
                // The header, then the offset at DESCRIPTOR_AT.
                let mut desc = [0u8; HEADER_BYTES + 8];
                desc[..self.header.len()].copy_from_slice(&self.header);
                desc[self.header.len()..].copy_from_slice(&(offset as u64).to_le_bytes());
                // SAFETY: `desc` lives across the call; it fits slot `k` of my mailbox on `dst`
                // (chunks hold at least a header and 64 payload bytes).
                unsafe {
                    ctx.b.put_signal_bytes(
                        peer,
                        slot + HEADER_AT,
                        desc.as_ptr(),
                        desc.len(),
                        slot,
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
                // (chunk size = flag + header + payload); `buf` holds `bytes` (contract),
                // `lo + len <= bytes`.
                unsafe {
                    match ctx.mapped {
                        // Direct stores where the heap is mapped; the flag's signal orders them
                        // before it (as a put-with-signal would).
                        Some(bases) => {
                            let dst = bases[self.dst].0.add(slot);
                            std::ptr::copy_nonoverlapping(self.header.as_ptr(), dst.add(HEADER_AT), self.header.len());
                            std::ptr::copy_nonoverlapping(self.buf.add(lo), dst.add(at), len);
                            ctx.b.signal_at(peer, slot, SignalWidth::W64, SignalOp::Set, k as i64)?;
                        }
                        None => {
                            ctx.b.put_bytes(peer, slot + HEADER_AT, self.header.as_ptr(), self.header.len())?;
                            ctx.b.put_signal_bytes(
                                peer,
                                slot + at,
                                self.buf.add(lo),
                                len,
                                slot,
                                SignalWidth::W64,
                                SignalOp::Set,
                                k as i64,
                            )?;
                        }
                    }
                }
            }
            p.sent[self.dst] = k;
            self.pushed += 1;
            moved = true;
        }
        if let Some(k) = self.awaiting {
            if acked(ctx, p, self.dst, k) {
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

    /// The chunk from `src` the next step needs; `None` when done or when a rendezvous copy
    /// can go on without waiting.
    fn need(&self, p: &Progress) -> Option<u64> {
        (!self.done() && self.pull.is_none()).then(|| p.received[self.src] + 1)
    }

    /// Consumes the chunks that have arrived, or copies up to `piece` bytes of a rendezvous
    /// message (then returns, so that a caller with a send in progress can serve it between
    /// pieces); never waits. Returns whether anything moved.
    ///
    /// # Safety
    /// `buf` is valid for `bytes` writes until [`Incoming::done`].
    unsafe fn step<B: HostMapped + ?Sized>(
        &mut self,
        ctx: &Ctx<'_, B>,
        p: &mut Progress,
        piece: usize,
    ) -> Result<bool> {
        let base = ctx.base;
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
                    // After the last read of the sender's buffer: the signal is a release store,
                    // so the sender may reuse its buffer once it sees it.
                    ctx.signal(self.src, ACK, k)?;
                }
                return Ok(true);
            }
            if self.done() {
                return Ok(moved);
            }
            let k = p.received[self.src] + 1;
            if !arrival(ctx, self.src, k).reached(ctx) {
                return Ok(moved);
            }
            moved = true;
            let slot = base.wrapping_add(slot_offset(ctx, self.src, k));
            // SAFETY: the slot lies in my mail buffer; the sender wrote it before its flag
            // (acquired above) and will not rewrite it before my ACK.
            let (msg_bytes, dtype_word) = unsafe {
                let header = slot.add(HEADER_AT).cast::<i64>();
                (header.read_unaligned() as usize, header.add(1).read_unaligned())
            };
            // The sender's layout, from the message's size as it sent it.
            let (at, payload) = (payload_at(msg_bytes), payload_of(&ctx.st.tun, msg_bytes));
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
                    // SAFETY: the descriptor's offset (8 bytes) follows the header in the slot.
                    let offset = unsafe { slot.add(DESCRIPTOR_AT).cast::<u64>().read_unaligned() } as usize;
                    self.pull = Some(Pull { k, offset, copied: 0 });
                    continue;
                }
            }
            if self.mismatch.is_none() {
                let lo = self.consumed * payload;
                let len = (self.bytes - lo).min(payload);
                // SAFETY: `lo + len <= bytes` (sizes agree); the chunk's payload follows the
                // header.
                unsafe { std::ptr::copy_nonoverlapping(slot.add(at), self.buf.add(lo), len) };
            }
            // A mismatching message is consumed all the same, a descriptor included, so that
            // its sender is released and the pair stays usable.
            p.received[self.src] = k;
            self.consumed += 1;
            ctx.signal(self.src, ACK, k)?;
        }
    }

    /// The outcome of a received message. Takes the error out rather than consuming `self`:
    /// moving the whole struct, error included (168 bytes), cost a `memcpy` call per message.
    fn finish(&mut self) -> Result<()> {
        self.mismatch.take().map_or(Ok(()), Err)
    }
}

/// Copies `len` bytes at `offset` of member `j`'s heap to `dst`: direct loads when peers'
/// heaps are mapped (and loads allowed), with `stores` (the caller fences streaming ones),
/// `get` otherwise.
///
/// # Safety
/// `dst` is valid for `len` writes and does not overlap the source, unless `j` is the caller
/// itself (then any overlap is tolerated); the source range lies in `j`'s heap.
unsafe fn copy_from_peer<B: HostMapped + ?Sized>(
    ctx: &Ctx<'_, B>,
    j: usize,
    offset: usize,
    dst: *mut u8,
    len: usize,
    stores: Stores,
) -> Result<()> {
    if j == ctx.me {
        // SAFETY: inside the caller's own heap (contract); `copy` tolerates overlap.
        unsafe { std::ptr::copy(ctx.base.add(offset), dst, len) };
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
pub unsafe fn send<B: HostMapped + ?Sized>(
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
pub unsafe fn recv<B: HostMapped + ?Sized>(
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
            let f = arrival(ctx, src, k);
            ctx.wait_flag(f, &|_| f.offset)?;
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
pub unsafe fn sendrecv<B: HostMapped + ?Sized>(
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
        let outgoing =
            out.need(p).map(|(value, what)| Flag { writer: dst, offset: ctx.word_offset(dst, ACK), value, what });
        let incoming = inc.need(p).map(|k| arrival(ctx, src, k));
        match (outgoing, incoming) {
            (Some(a), Some(b)) => ctx.wait_any(&[a, b], &|_| false)?,
            (Some(a), None) => ctx.wait_word(dst, ACK, a.value, a.what)?,
            (None, Some(b)) => ctx.wait_flag(b, &|_| b.offset)?,
            // Unreachable: a call not done needs a word or can move without one.
            (None, None) => {}
        }
    }
}
