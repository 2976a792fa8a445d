//! send / recv: ordered, flow-controlled messages through per-sender mailboxes.
//!
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

use super::state::{Ctx, Progress, ACK, MAIL_HEADER, MAIL_SLOTS, SENT};
use crate::backend::{Backend, SignalWidth};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::op::SignalOp;

fn slot_offset<B: Backend + ?Sized>(ctx: &Ctx<'_, B>, sender: usize, k: u64) -> usize {
    let chunk = ctx.st.tun.mail_chunk;
    ctx.st.mail.heap_offset() + (sender * MAIL_SLOTS + ((k - 1) as usize % MAIL_SLOTS)) * chunk
}

fn chunks_of(bytes: usize, payload: usize) -> usize {
    bytes.div_ceil(payload).max(1)
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
    let payload = ctx.st.tun.mail_chunk - MAIL_HEADER;
    let peer = ctx.group.ranks()[dst];
    let mut header = [0u8; MAIL_HEADER];
    header[..8].copy_from_slice(&(bytes as i64).to_le_bytes());
    header[8..].copy_from_slice(&i64::from(dtype.code()).to_le_bytes());
    for i in 0..chunks_of(bytes, payload) {
        let k = p.sent[dst] + 1;
        if k > MAIL_SLOTS as u64 {
            ctx.wait_word(dst, ACK, k - MAIL_SLOTS as u64, "mailbox acknowledgement")?;
        }
        let slot = slot_offset(ctx, ctx.me, k);
        let lo = i * payload;
        let len = (bytes - lo).min(payload);
        // SAFETY: the header and the chunk lie inside slot `k` of my mailbox on `dst` (chunk
        // size = header + payload); `buf` holds `bytes` (contract), `lo + len <= bytes`.
        unsafe {
            ctx.b.put_bytes(peer, slot, header.as_ptr(), MAIL_HEADER)?;
            ctx.b.put_signal_bytes(
                peer,
                slot + MAIL_HEADER,
                buf.add(lo),
                len,
                ctx.word_offset(ctx.me, SENT),
                SignalWidth::W64,
                SignalOp::Set,
                k as i64,
            )?;
        }
        p.sent[dst] = k;
    }
    Ok(())
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
    let payload = ctx.st.tun.mail_chunk - MAIL_HEADER;
    let base = ctx.b.local_heap_base();
    let mut total_chunks = 1;
    let mut mismatch = None;
    let mut i = 0;
    while i < total_chunks {
        let k = p.received[src] + 1;
        ctx.wait_word(src, SENT, k, "mailbox")?;
        let slot = base.wrapping_add(slot_offset(ctx, src, k));
        // SAFETY: the slot lies in my mail buffer; the sender wrote it before SENT (acquired by
        // the wait) and will not rewrite it before my ACK.
        let (msg_bytes, msg_dtype) =
            unsafe { (slot.cast::<i64>().read_unaligned() as usize, slot.add(8).cast::<i64>().read_unaligned()) };
        if i == 0 {
            total_chunks = chunks_of(msg_bytes, payload);
            if msg_bytes != bytes || msg_dtype != i64::from(dtype.code()) {
                let theirs_dtype = DType::from_code(msg_dtype).map_or_else(|_| "?".to_string(), |d| d.to_string());
                mismatch = Some(Error::Mismatch {
                    rank: ctx.b.rank(),
                    op: ctx.op.into(),
                    peer: ctx.group.ranks()[src],
                    mine: format!("recv of {} elements of {dtype}", bytes / dtype.size()),
                    theirs: format!("a message of {msg_bytes} bytes of {theirs_dtype}"),
                });
            }
        }
        if mismatch.is_none() {
            let lo = i * payload;
            let len = (bytes - lo).min(payload);
            // SAFETY: `lo + len <= bytes` (sizes agree); the chunk's payload follows the header.
            unsafe { std::ptr::copy_nonoverlapping(slot.add(MAIL_HEADER), buf.add(lo), len) };
        }
        p.received[src] = k;
        ctx.signal(src, ACK, k)?;
        i += 1;
    }
    mismatch.map_or(Ok(()), Err)
}
