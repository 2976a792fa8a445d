//! The live allocations of one communicator, by heap offset: how a tensor's address is
//! recognised as symmetric memory, and what `free` releases.

use std::collections::BTreeMap;
use std::sync::Mutex;

use symm_core::{Group, SymmBuffer};

/// Why an address range is not inside a live allocation.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Miss {
    /// No live allocation contains the start (never allocated, or freed).
    NotAllocated,
    /// The range starts inside the allocation `(start, bytes)` but runs past its end.
    Overruns { start: usize, bytes: usize },
}

/// An allocation found for an address range.
#[derive(Debug)]
pub(crate) struct Found {
    /// Heap offset of the allocation.
    pub start: usize,
    /// Its size in bytes.
    pub bytes: usize,
    /// The group it was allocated in.
    pub group: Group,
}

#[derive(Debug)]
struct Live {
    id: u64,
    buf: SymmBuffer,
}

#[derive(Debug, Default)]
struct Inner {
    live: BTreeMap<usize, Live>,
    next_id: u64,
}

/// The allocations of one communicator that are still reserved and reachable from Python.
///
/// Zero-byte allocations reserve nothing and are not recorded.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    inner: Mutex<Inner>,
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A poisoned lock means a panic between two statements that each keep the map whole.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a new allocation; returns its id (unique for the communicator's life, so a
    /// stale handle never matches a later allocation at the same offset).
    pub(crate) fn insert(&self, buf: SymmBuffer) -> u64 {
        let mut inner = self.lock();
        inner.next_id += 1;
        let id = inner.next_id;
        if buf.bytes() > 0 {
            inner.live.insert(buf.heap_offset(), Live { id, buf });
        }
        id
    }

    /// The allocation that holds the bytes `[offset, offset + bytes)` of the heap.
    pub(crate) fn find(&self, offset: usize, bytes: usize) -> Result<Found, Miss> {
        let inner = self.lock();
        let (&start, live) = inner.live.range(..=offset).next_back().ok_or(Miss::NotAllocated)?;
        let len = live.buf.bytes();
        let end = start + len;
        if offset >= end {
            return Err(Miss::NotAllocated);
        }
        match offset.checked_add(bytes) {
            Some(last) if last <= end => Ok(Found { start, bytes: len, group: live.buf.group().clone() }),
            _ => Err(Miss::Overruns { start, bytes: len }),
        }
    }

    /// Removes the allocation that starts at `start` (to free it); `None` if there is none.
    pub(crate) fn take(&self, start: usize) -> Option<(u64, SymmBuffer)> {
        self.lock().live.remove(&start).map(|l| (l.id, l.buf))
    }

    /// Puts back an allocation taken by [`Registry::take`] whose free failed.
    pub(crate) fn restore(&self, id: u64, buf: SymmBuffer) {
        self.lock().live.insert(buf.heap_offset(), Live { id, buf });
    }

    /// The Python owner of allocation `id` at `start` is gone without `free`: nothing can
    /// reach the range any more. Returns the allocation, for the communicator to abandon (the
    /// range comes back once every member has dropped it); `None` when it was freed already
    /// (or the id is stale).
    pub(crate) fn drop_block(&self, id: u64, start: usize) -> Option<SymmBuffer> {
        let mut inner = self.lock();
        if inner.live.get(&start).is_some_and(|l| l.id == id) {
            inner.live.remove(&start).map(|l| l.buf)
        } else {
            None
        }
    }

    /// Bytes and number of allocations that are live.
    pub(crate) fn live(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.live.values().map(|l| l.buf.bytes()).sum(), inner.live.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use symm_core::{DType, Rank};

    fn buf(offset: usize, len: usize) -> SymmBuffer {
        let g = Group::new(2, Rank(0), &[Rank(0), Rank(1)], Ok(())).unwrap();
        SymmBuffer::from_parts(7, g, offset, len, DType::F32)
    }

    #[test]
    fn finds_ranges_inside_allocations_only() {
        let r = Registry::default();
        r.insert(buf(0, 4)); // 16 bytes at 0
        r.insert(buf(64, 2)); // 8 bytes at 64
        assert_eq!(r.find(0, 16).unwrap().start, 0);
        assert_eq!(r.find(4, 8).unwrap().start, 0);
        assert_eq!(r.find(68, 4).unwrap().start, 64);
        assert_eq!(r.find(68, 4).unwrap().bytes, 8);
        assert_eq!(r.find(16, 4).unwrap_err(), Miss::NotAllocated);
        assert_eq!(r.find(32, 0).unwrap_err(), Miss::NotAllocated);
        assert_eq!(r.find(8, 16).unwrap_err(), Miss::Overruns { start: 0, bytes: 16 });
        assert_eq!(r.find(8, usize::MAX).unwrap_err(), Miss::Overruns { start: 0, bytes: 16 });
        assert_eq!(r.live(), (24, 2));
    }

    #[test]
    fn take_restore_and_drop_track_ids() {
        let r = Registry::default();
        let a = r.insert(buf(0, 4));
        let (id, b) = r.take(0).unwrap();
        assert_eq!(id, a);
        assert!(r.find(0, 4).is_err());
        r.restore(id, b);
        assert!(r.find(0, 4).is_ok());
        // A stale owner (another id at the same offset) does not drop the live allocation.
        assert!(r.drop_block(a + 100, 0).is_none());
        assert!(r.find(0, 4).is_ok());
        assert_eq!(r.drop_block(a, 0).map(|b| b.bytes()), Some(16));
        assert!(r.find(0, 4).is_err());
        assert!(r.drop_block(a, 0).is_none());
        // Zero-byte allocations get an id but reserve nothing.
        let z = r.insert(buf(0, 0));
        assert!(z > a);
        assert_eq!(r.live(), (0, 0));
    }
}
