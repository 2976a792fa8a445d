//! Copies that write a result nobody will read soon: streaming (non-temporal) stores.
//!
//! An ordinary store to a line that is not in the cache first reads the line from memory
//! (read-for-ownership), so writing `S` fresh bytes costs `2S` of memory traffic. Streaming
//! stores write whole lines without reading them, which is what large collectives want for
//! outputs far bigger than the caches. They are wrong for small outputs (the data would be
//! evicted from the cache the caller is about to read it from), so callers choose per call
//! (the host engine's `Tunables::stream_min`).
//!
//! Streaming stores are weakly ordered: after the last one, [`fence`] must run before a
//! release store (a flag) tells a peer the data is there.

/// How a copy writes its destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stores {
    /// Ordinary stores (the destination ends up in the cache).
    Cached,
    /// Non-temporal stores where the CPU has them (x86-64), ordinary stores elsewhere; call
    /// [`fence`] before publishing the data.
    Streaming,
}

impl Stores {
    /// Streaming for calls moving at least `min` bytes.
    pub fn for_bytes(bytes: usize, min: usize) -> Stores {
        if bytes >= min {
            Stores::Streaming
        } else {
            Stores::Cached
        }
    }
}

/// Copies `bytes` from `src` to `dst`, nothing when they are the same memory.
///
/// # Safety
/// `src` is valid for `bytes` reads, `dst` for `bytes` writes; the ranges are identical or
/// disjoint.
pub unsafe fn copy(src: *const u8, dst: *mut u8, bytes: usize, stores: Stores) {
    if bytes == 0 || std::ptr::eq(src, dst) {
        return;
    }
    match stores {
        // SAFETY: forwarded (disjoint: identical ranges returned above).
        Stores::Streaming => unsafe { stream(src, dst, bytes) },
        // SAFETY: as above.
        Stores::Cached => unsafe { std::ptr::copy_nonoverlapping(src, dst, bytes) },
    }
}

/// Orders every streaming store made so far before later stores (x86-64 `sfence`); a no-op
/// for [`Stores::Cached`] and on CPUs without streaming stores.
pub fn fence(stores: Stores) {
    // Not under miri, which has no `sfence` and runs streaming stores as ordinary ones.
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if stores == Stores::Streaming {
        // SAFETY: `sfence` has no preconditions (SSE, part of the x86-64 baseline).
        unsafe { std::arch::x86_64::_mm_sfence() };
    }
    #[cfg(any(not(target_arch = "x86_64"), miri))]
    let _ = stores;
}

/// Bytes per streaming loop step: one cache line, four 16-byte stores, which the CPU's
/// write-combining buffers merge into one full-line write.
#[cfg(target_arch = "x86_64")]
const LINE: usize = 64;

/// # Safety
/// As [`copy`], ranges disjoint.
#[cfg(target_arch = "x86_64")]
unsafe fn stream(src: *const u8, dst: *mut u8, bytes: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128};
    // Ordinary stores up to the first 16-byte boundary of `dst` (streaming stores need it
    // aligned), streaming stores for whole lines, ordinary stores for the rest.
    let head = dst.align_offset(16).min(bytes);
    // SAFETY: `head <= bytes`, inside both ranges (contract).
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let mut i = head;
    while i + LINE <= bytes {
        // SAFETY: `i + LINE <= bytes`, so the four 16-byte loads and stores are inside the
        // ranges; `dst + i` is 16-aligned (head, then steps of 64); loads may be unaligned.
        // SSE2 is part of the x86-64 baseline.
        unsafe {
            let s = src.add(i).cast::<__m128i>();
            let d = dst.add(i).cast::<__m128i>();
            let (a, b, c, e) =
                (_mm_loadu_si128(s), _mm_loadu_si128(s.add(1)), _mm_loadu_si128(s.add(2)), _mm_loadu_si128(s.add(3)));
            stream16(d, a);
            stream16(d.add(1), b);
            stream16(d.add(2), c);
            stream16(d.add(3), e);
        }
        i += LINE;
    }
    // SAFETY: the rest, `bytes - i` bytes, lies inside both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), bytes - i) };
}

/// One streaming store of 16 bytes; under miri, which runs no inline assembly, an ordinary
/// store (which miri checks for the alignment the streaming store needs).
///
/// # Safety
/// `d` is valid for a 16-byte write and 16-aligned.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn stream16(d: *mut std::arch::x86_64::__m128i, v: std::arch::x86_64::__m128i) {
    // SAFETY: forwarded; SSE2 is part of the x86-64 baseline.
    #[cfg(not(miri))]
    unsafe {
        std::arch::x86_64::_mm_stream_si128(d, v)
    };
    // SAFETY: forwarded.
    #[cfg(miri)]
    unsafe {
        d.write(v)
    };
}

/// # Safety
/// As [`copy`], ranges disjoint.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn stream(src: *const u8, dst: *mut u8, bytes: usize) {
    // SAFETY: forwarded.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, bytes) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_every_alignment_and_length() {
        // Under miri (about a thousand times slower) shorter buffers, without the longest
        // length (200 bytes already stream whole lines between a head and a tail).
        let size = if cfg!(miri) { 300 } else { 1000 };
        let src: Vec<u8> = (0..size as u32).map(|i| (i * 7 + 3) as u8).collect();
        for stores in [Stores::Cached, Stores::Streaming] {
            // Under miri every fifth alignment.
            for dst_shift in (0..17).step_by(if cfg!(miri) { 5 } else { 1 }) {
                for len in [0, 1, 15, 16, 17, 63, 64, 65, 200, 900].into_iter().filter(|len| len + 17 <= size) {
                    let mut dst = vec![0xAAu8; size];
                    // SAFETY: `len + 17 <= size` for both buffers; they are disjoint.
                    unsafe { copy(src.as_ptr().add(3), dst.as_mut_ptr().add(dst_shift), len, stores) };
                    fence(stores);
                    assert_eq!(&dst[dst_shift..dst_shift + len], &src[3..3 + len], "{stores:?} {dst_shift} {len}");
                    assert!(dst[..dst_shift].iter().chain(&dst[dst_shift + len..]).all(|&b| b == 0xAA));
                }
            }
        }
    }

    #[test]
    fn chooses_streaming_from_the_size() {
        assert_eq!(Stores::for_bytes(100, 1 << 20), Stores::Cached);
        assert_eq!(Stores::for_bytes(1 << 20, 1 << 20), Stores::Streaming);
    }
}
