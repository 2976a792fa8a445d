//! Collective allocation in the symmetric heap: every member of a group must get the same
//! offset, though each member's heap holds the buffers of its other groups too.
//!
//! The heap is one SHMEM allocation made at start-up (SHMEM's own allocations are host-blocking
//! collectives of the whole world), and symm places buffers in it. The CPU backend reads its
//! peers' allocation bitmaps in shared memory; here the members exchange their reserved ranges
//! through the start-up store ([`symm_core::Bootstrap::exchange`]) and each computes the same
//! answer from the same lists: the first range of [`GRANULE`]s free on every member. A round's
//! record also carries the request, so members that disagree all fail alike and nothing is
//! reserved.

use symm_core::GroupId;

/// Allocation unit: offsets and sizes are multiples of it (above the 64 bytes device copies
/// need, and the 4 of a signal).
pub const GRANULE: usize = 512;

/// This rank's reserved ranges: `(start, end, group)`, sorted by start, disjoint.
#[derive(Debug, Default)]
pub struct Ranges {
    used: Vec<(usize, usize, GroupId)>,
}

/// What a member asks in one round of a group's heap calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Reserve this many bytes; with the member's reserved ranges.
    Alloc { bytes: usize, used: Vec<(usize, usize)> },
    /// Release the range at this offset of this many bytes.
    Free { offset: usize, bytes: usize },
}

impl Request {
    /// Its record in the exchange.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Request::Alloc { bytes, used } => {
                let ranges: Vec<String> = used.iter().map(|(s, e)| format!("{s}-{e}")).collect();
                format!("alloc {bytes} {}", ranges.join(",")).into_bytes()
            }
            Request::Free { offset, bytes } => format!("free {offset} {bytes}").into_bytes(),
        }
    }

    /// The request of a record; `None` for one this version cannot read.
    pub fn decode(record: &[u8]) -> Option<Request> {
        let text = std::str::from_utf8(record).ok()?;
        let mut parts = text.split(' ');
        match (parts.next()?, parts.next()?, parts.next()) {
            ("alloc", bytes, ranges) => {
                let mut used = Vec::new();
                for r in ranges.unwrap_or("").split(',').filter(|r| !r.is_empty()) {
                    let (s, e) = r.split_once('-')?;
                    used.push((s.parse().ok()?, e.parse().ok()?));
                }
                Some(Request::Alloc { bytes: bytes.parse().ok()?, used })
            }
            ("free", offset, Some(bytes)) => {
                Some(Request::Free { offset: offset.parse().ok()?, bytes: bytes.parse().ok()? })
            }
            _ => None,
        }
    }

    /// In words, for a mismatch's message.
    pub fn describe(&self) -> String {
        match self {
            Request::Alloc { bytes, .. } => format!("allocate {bytes} bytes"),
            Request::Free { offset, bytes } => format!("free {bytes} bytes at offset {offset}"),
        }
    }
}

/// `bytes` rounded up to whole granules (at least one, so that every buffer has its own offset).
pub fn granular(bytes: usize) -> usize {
    bytes.max(1).div_ceil(GRANULE) * GRANULE
}

/// The first offset of `bytes` (granular) free in every list of `used` ranges within a heap of
/// `heap` bytes; `Err(largest)`: none, and the longest range free on every member.
pub fn first_common_free(used: &[Vec<(usize, usize)>], heap: usize, bytes: usize) -> Result<usize, usize> {
    let mut all: Vec<(usize, usize)> = used.iter().flatten().copied().collect();
    all.sort_unstable();
    let (mut at, mut largest) = (0usize, 0usize);
    for (s, e) in all {
        if s > at {
            if s - at >= bytes {
                return Ok(at);
            }
            largest = largest.max(s - at);
        }
        at = at.max(e);
    }
    let tail = heap.saturating_sub(at);
    if tail >= bytes {
        Ok(at)
    } else {
        Err(largest.max(tail))
    }
}

impl Ranges {
    /// The reserved ranges, without their groups.
    pub fn list(&self) -> Vec<(usize, usize)> {
        self.used.iter().map(|&(s, e, _)| (s, e)).collect()
    }

    /// Reserves `[start, start + bytes)` for `group` (free here: the agreement found it so).
    pub fn insert(&mut self, start: usize, bytes: usize, group: GroupId) {
        let at = self.used.partition_point(|r| r.0 < start);
        self.used.insert(at, (start, start + bytes, group));
    }

    /// Whether `group` holds exactly `[offset, offset + bytes)` here.
    pub fn holds(&self, offset: usize, bytes: usize, group: GroupId) -> bool {
        self.used.iter().any(|&r| r == (offset, offset + bytes, group))
    }

    /// Releases the range `group` holds at `offset`.
    pub fn remove(&mut self, offset: usize, bytes: usize, group: GroupId) {
        self.used.retain(|&r| r != (offset, offset + bytes, group));
    }

    /// Bytes reserved, and the number of ranges.
    pub fn reserved(&self) -> (usize, usize) {
        (self.used.iter().map(|r| r.1 - r.0).sum(), self.used.len())
    }

    /// The longest free range of a heap of `heap` bytes.
    pub fn largest_free(&self, heap: usize) -> usize {
        first_common_free(&[self.list()], heap, usize::MAX).unwrap_err()
    }

    /// Bytes and ranges held by each group.
    pub fn by_group(&self) -> Vec<(GroupId, usize, usize)> {
        let mut out: Vec<(GroupId, usize, usize)> = Vec::new();
        for &(s, e, g) in &self.used {
            match out.iter_mut().find(|x| x.0 == g) {
                Some(x) => {
                    x.1 += e - s;
                    x.2 += 1;
                }
                None => out.push((g, e - s, 1)),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use symm_core::Rank;

    #[test]
    fn the_first_range_free_on_every_member_is_chosen() {
        let heap = 8 * GRANULE;
        let g = GRANULE;
        // Member 0 holds [0, 2g), member 1 holds [3g, 4g): the first common gap of 1 granule is
        // 2g, of 2 granules 4g, of 5 none.
        let used = vec![vec![(0, 2 * g)], vec![(3 * g, 4 * g)]];
        assert_eq!(first_common_free(&used, heap, g), Ok(2 * g));
        assert_eq!(first_common_free(&used, heap, 2 * g), Ok(4 * g));
        assert_eq!(first_common_free(&used, heap, 5 * g), Err(4 * g));
        assert_eq!(first_common_free(&[vec![], vec![]], heap, heap), Ok(0));
        assert_eq!(first_common_free(&[vec![(0, heap)]], heap, g), Err(0));
        // Overlapping ranges of different members.
        let used = vec![vec![(0, 3 * g)], vec![(g, 2 * g), (5 * g, 6 * g)]];
        assert_eq!(first_common_free(&used, heap, 2 * g), Ok(3 * g));
        assert_eq!(first_common_free(&used, heap, 3 * g), Err(2 * g));
    }

    #[test]
    fn requests_travel_as_text() {
        for r in [
            Request::Alloc { bytes: 4096, used: vec![(0, 512), (1024, 2048)] },
            Request::Alloc { bytes: 0, used: vec![] },
            Request::Free { offset: 512, bytes: 1024 },
        ] {
            assert_eq!(Request::decode(&r.encode()), Some(r));
        }
        assert_eq!(Request::decode(b"grow 1 2"), None);
        assert_eq!(Request::decode(b"alloc x"), None);
        assert_eq!(Request::decode(b"alloc 1 5-"), None);
    }

    #[test]
    fn ranges_are_kept_per_group() {
        let (a, b) = (GroupId::of(&[Rank(0), Rank(1)]), GroupId::of(&[Rank(0)]));
        let mut r = Ranges::default();
        r.insert(1024, 512, a);
        r.insert(0, 512, b);
        assert_eq!(r.list(), vec![(0, 512), (1024, 1536)]);
        assert!(r.holds(1024, 512, a) && !r.holds(1024, 512, b));
        assert_eq!(r.largest_free(4096), 4096 - 1536);
        assert_eq!(r.reserved(), (1024, 2));
        r.remove(1024, 512, a);
        assert_eq!(r.list(), vec![(0, 512)]);
        assert_eq!(granular(0), GRANULE);
        assert_eq!(granular(GRANULE + 1), 2 * GRANULE);
    }
}
