//! Copies that write a result nobody will read soon: streaming (non-temporal) stores.
//!
//! An ordinary store to a line that is not in the cache first reads the line from memory
//! (read-for-ownership), so writing `S` fresh bytes costs `2S` of memory traffic. Streaming
//! stores write whole lines without reading them, which is what large collectives want for
//! outputs far bigger than the caches. They are wrong for small outputs (the data would be
//! evicted from the cache the caller is about to read it from), so callers choose per call
//! ([`Tunables::stream_min`](super::state::Tunables::stream_min)).
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
        // SAFETY: as above (`copy_bytes` allows any overlap).
        Stores::Cached => unsafe { copy_bytes(src, dst, bytes) },
    }
}

/// Largest copy [`copy_bytes`] makes inline.
const SMALL: usize = 32;

/// Copies `bytes` from `src` to `dst` like `std::ptr::copy` (the ranges may overlap), inline
/// for up to 32 bytes. A small message's payload is shorter than the C library's `memmove`
/// takes to call and to pick its loop: under callgrind an 8-byte sendrecv spent about 29
/// instructions a call in it, against 8 here.
///
/// # Safety
/// `src` is valid for `bytes` reads, `dst` for `bytes` writes.
#[inline]
pub unsafe fn copy_bytes(src: *const u8, dst: *mut u8, bytes: usize) {
    if bytes <= SMALL {
        // SAFETY: forwarded.
        unsafe { copy_small(src, dst, bytes) }
    } else {
        // SAFETY: forwarded.
        unsafe { std::ptr::copy(src, dst, bytes) }
    }
}

/// [`copy_bytes`] for at most [`SMALL`] bytes: two possibly overlapping words of the largest
/// width that fits, the first at the start and the second ending at the end. Both loads come
/// before either store, so overlapping ranges copy correctly.
///
/// # Safety
/// As [`copy_bytes`], with `bytes <= SMALL`.
#[inline(always)]
unsafe fn copy_small(src: *const u8, dst: *mut u8, bytes: usize) {
    /// Copies `[0, W)` and `[bytes - W, bytes)` as words of `T` (`W = size_of::<T>()`).
    ///
    /// # Safety
    /// As [`copy_bytes`], with `W <= bytes <= 2 W`.
    #[inline(always)]
    unsafe fn ends<T: Copy>(src: *const u8, dst: *mut u8, bytes: usize) {
        let last = bytes - std::mem::size_of::<T>();
        // SAFETY: both words lie inside the ranges (`size_of::<T>() <= bytes`); unaligned
        // accesses are what `read_unaligned` and `write_unaligned` are for.
        unsafe {
            let (a, b) = (src.cast::<T>().read_unaligned(), src.add(last).cast::<T>().read_unaligned());
            dst.cast::<T>().write_unaligned(a);
            dst.add(last).cast::<T>().write_unaligned(b);
        }
    }
    // SAFETY: in every arm the sizes are those `ends` needs for its word; the bytes lie in the
    // ranges (contract).
    unsafe {
        match bytes {
            0 => {}
            1 => *dst = *src,
            2..=3 => ends::<u16>(src, dst, bytes),
            4..=7 => ends::<u32>(src, dst, bytes),
            8..=15 => ends::<u64>(src, dst, bytes),
            _ => ends::<u128>(src, dst, bytes),
        }
    }
}

/// Orders every streaming store made so far before later stores (x86-64 `sfence`); a no-op
/// for [`Stores::Cached`] and on CPUs without streaming stores.
pub fn fence(stores: Stores) {
    #[cfg(target_arch = "x86_64")]
    if stores == Stores::Streaming {
        // SAFETY: `sfence` has no preconditions (SSE, part of the x86-64 baseline).
        unsafe { std::arch::x86_64::_mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
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
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
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
            _mm_stream_si128(d, a);
            _mm_stream_si128(d.add(1), b);
            _mm_stream_si128(d.add(2), c);
            _mm_stream_si128(d.add(3), e);
        }
        i += LINE;
    }
    // SAFETY: the rest, `bytes - i` bytes, lies inside both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), bytes - i) };
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
        let src: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        for stores in [Stores::Cached, Stores::Streaming] {
            for dst_shift in 0..17 {
                for len in [0, 1, 15, 16, 17, 63, 64, 65, 200, 900] {
                    let mut dst = vec![0xAAu8; 1000];
                    // SAFETY: `len + 17 <= 1000` for both buffers; they are disjoint.
                    unsafe { copy(src.as_ptr().add(3), dst.as_mut_ptr().add(dst_shift), len, stores) };
                    fence(stores);
                    assert_eq!(&dst[dst_shift..dst_shift + len], &src[3..3 + len], "{stores:?} {dst_shift} {len}");
                    assert!(dst[..dst_shift].iter().chain(&dst[dst_shift + len..]).all(|&b| b == 0xAA));
                }
            }
        }
    }

    #[test]
    fn copies_small_sizes_with_any_overlap() {
        for len in 0..=SMALL + 3 {
            for shift in 0..=len.min(9) {
                for (from, to) in [(0, shift), (shift, 0)] {
                    let mut buf: Vec<u8> = (0..80u8).collect();
                    let mut want = buf.clone();
                    want.copy_within(from + 5..from + 5 + len, to + 5);
                    // SAFETY: both ranges lie inside `buf` (5 + 9 + 35 < 80); overlap is allowed.
                    unsafe { copy_bytes(buf.as_ptr().add(from + 5), buf.as_mut_ptr().add(to + 5), len) };
                    assert_eq!(buf, want, "len {len}, from {from} to {to}");
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
