//! First-fit allocation over the intersection of several ranks' heaps.
//!
//! Each rank's heap has a bitmap (one bit per [`GRANULE`], 1 = in use). A collective allocation
//! looks for the first run of free granules that is free on *every* member, so the buffer gets
//! the same offset everywhere even when members take part in other groups whose allocations
//! interleave differently on each of them. Ranges that the members are reclaiming in the same
//! round (dropped by every member) count as free through a mask.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::control::GRANULE;

/// Granules needed for `bytes`.
pub fn granules(bytes: usize) -> usize {
    bytes.div_ceil(GRANULE)
}

/// The union of the members' used bits for word `w`, less the bits of `freed` (ranges being
/// reclaimed); bits past `total` granules count as used.
fn used_word(bitmaps: &[&[AtomicU64]], freed: Option<&[u64]>, w: usize, total: usize) -> u64 {
    // Relaxed: the bitmaps are stable while the allocation protocol reads them (their owners
    // hold their allocation locks and wait in a barrier); the acquire that made them visible
    // happened when each owner's `alloc_seq` was read.
    let mut used = bitmaps.iter().fold(0u64, |acc, b| acc | b[w].load(Ordering::Relaxed));
    if let Some(f) = freed {
        used &= !f[w];
    }
    let first_bit = w * 64;
    if first_bit + 64 > total {
        let valid = total.saturating_sub(first_bit);
        used |= if valid == 0 { u64::MAX } else { u64::MAX << valid };
    }
    used
}

/// The first granule of a run of `need` granules free in every bitmap, or the longest common
/// free run (in granules) when there is none.
pub fn find_common_free(bitmaps: &[&[AtomicU64]], total: usize, need: usize) -> Result<usize, usize> {
    find_common_free_with(bitmaps, None, total, need)
}

/// [`find_common_free`] with the granules set in `freed` (a mask of the bitmaps' length)
/// counted as free on every member.
pub fn find_common_free_with(
    bitmaps: &[&[AtomicU64]],
    freed: Option<&[u64]>,
    total: usize,
    need: usize,
) -> Result<usize, usize> {
    let words = total.div_ceil(64);
    let (mut run_start, mut run_len, mut longest) = (0usize, 0usize, 0usize);
    for w in 0..words {
        let used = used_word(bitmaps, freed, w, total);
        if used == 0 && run_len + 64 < need {
            // A wholly free word that cannot finish the run: extend and move on.
            if run_len == 0 {
                run_start = w * 64;
            }
            run_len += 64;
            longest = longest.max(run_len);
            continue;
        }
        if used == u64::MAX {
            run_len = 0;
            continue;
        }
        for bit in 0..64 {
            if used & (1 << bit) != 0 {
                run_len = 0;
                continue;
            }
            if run_len == 0 {
                run_start = w * 64 + bit;
            }
            run_len += 1;
            longest = longest.max(run_len);
            if run_len == need {
                return Ok(run_start);
            }
        }
    }
    Err(longest)
}

/// Marks granules `start..start + n` used (`used = true`) or free in the caller's own bitmap.
pub fn mark(bitmap: &[AtomicU64], start: usize, n: usize, used: bool) {
    for g in start..start + n {
        let (w, bit) = (g / 64, g % 64);
        // Relaxed: only the owner (under its allocation lock) writes its bitmap; readers see it
        // through the acquire/release of the allocation protocol.
        if used {
            bitmap[w].fetch_or(1 << bit, Ordering::Relaxed);
        } else {
            bitmap[w].fetch_and(!(1 << bit), Ordering::Relaxed);
        }
    }
}

/// Number of free granules in one bitmap.
pub fn free_granules(bitmap: &[AtomicU64], total: usize) -> usize {
    (0..bitmap.len()).map(|w| (!used_word(&[bitmap], None, w, total)).count_ones() as usize).sum()
}

/// The longest run of free granules in one bitmap.
pub fn largest_free_run(bitmap: &[AtomicU64], total: usize) -> usize {
    find_common_free(&[bitmap], total, total + 1).unwrap_err()
}

/// Whether granule `g` is set in `bitmap`.
pub fn is_set(bitmap: &[AtomicU64], g: usize) -> bool {
    // Relaxed: as in `used_word`, read while the protocol keeps the bitmap stable.
    bitmap[g / 64].load(Ordering::Relaxed) & (1 << (g % 64)) != 0
}

/// A mask of `words` words with the granules of `ranges` (`(first granule, granules)`) set.
pub fn mask(words: usize, ranges: impl IntoIterator<Item = (usize, usize)>) -> Vec<u64> {
    let mut m = vec![0u64; words];
    for (start, n) in ranges {
        for g in start..start + n {
            m[g / 64] |= 1 << (g % 64);
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bitmap(words: usize) -> Vec<AtomicU64> {
        (0..words).map(|_| AtomicU64::new(0)).collect()
    }

    #[test]
    fn first_fit_over_the_intersection() {
        let (a, b) = (bitmap(4), bitmap(4));
        mark(&a, 0, 3, true); // a: 0..3 used
        mark(&b, 4, 2, true); // b: 4..6 used
        assert_eq!(find_common_free(&[&a, &b], 256, 1), Ok(3));
        assert_eq!(find_common_free(&[&a, &b], 256, 2), Ok(6));
        assert_eq!(find_common_free(&[&a, &b], 256, 100), Ok(6));
        assert_eq!(find_common_free(&[&a, &b], 256, 250), Ok(6));
        assert_eq!(find_common_free(&[&a, &b], 256, 251), Err(250));
        assert_eq!(find_common_free(&[&a], 100, 97), Ok(3));
        assert_eq!(find_common_free(&[&a], 100, 98), Err(97));
        mark(&a, 0, 3, false);
        assert_eq!(free_granules(&a, 100), 100);
    }

    #[test]
    fn reclaimed_ranges_count_as_free() {
        let (a, b) = (bitmap(2), bitmap(2));
        mark(&a, 0, 10, true);
        mark(&b, 0, 10, true);
        mark(&a, 20, 1, true);
        assert_eq!(find_common_free(&[&a, &b], 128, 15), Ok(21));
        let freed = mask(2, [(0, 10)]);
        assert_eq!(find_common_free_with(&[&a, &b], Some(&freed), 128, 15), Ok(0));
        assert_eq!(find_common_free_with(&[&a, &b], Some(&freed), 128, 21), Ok(21));
        assert_eq!(largest_free_run(&a, 128), 107);
        assert!(is_set(&a, 20) && !is_set(&a, 21));
    }

    #[test]
    fn runs_cross_word_boundaries() {
        let a = bitmap(3);
        mark(&a, 0, 60, true);
        mark(&a, 70, 1, true);
        assert_eq!(find_common_free(&[&a], 192, 10), Ok(60));
        assert_eq!(find_common_free(&[&a], 192, 11), Ok(71));
        assert_eq!(find_common_free(&[&a], 192, 121), Ok(71));
        assert_eq!(find_common_free(&[&a], 192, 122), Err(121));
    }
}
