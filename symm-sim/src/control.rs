//! The control area at the start of every rank's segment: a header (identity, doorbell, closed
//! mark), a table of group slots, the allocation bitmap of the rank's heap, the bitmap of the
//! allocations the rank has dropped (published for the members to reclaim together), and the
//! rank's flight-recorder ring (see `symm_core::dfx::recorder`).
//!
//! Everything here lives in shared memory mapped by every rank of the host, so every field is
//! an atomic and every access states its ordering. The segment starts zero-filled (memfd), and
//! zero is the meaning of "nothing yet" for every field.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU32, AtomicU64};

use symm_core::dfx::FlightRing;

use crate::sys::Mapping;

/// Marks an initialised segment ("symmseg1").
pub const MAGIC: u64 = u64::from_le_bytes(*b"symmseg1");
/// Group slots per rank: the number of groups a rank can take part in.
pub const MAX_GROUPS: usize = 256;
/// Allocation granule: heap offsets and sizes are multiples of it (one page).
pub const GRANULE: usize = 4096;
/// Words of per-group scratch the collectives use for their own flags.
pub const COLL_WORDS: usize = 64;
/// [`Header::closed`]: the owner is running.
pub const OPEN: u64 = 0;
/// [`Header::closed`]: the owner dropped its communicator.
pub const CLOSED: u64 = 1;
/// [`Header::closed`]: the owner's process exited with its communicator open.
pub const EXITED: u64 = 2;

/// [`GroupSlot::req_kind`]: the request is a collective allocation.
pub const REQ_ALLOC: u64 = 1;
/// [`GroupSlot::req_kind`]: the request is a collective free.
pub const REQ_FREE: u64 = 2;

/// One value alone on its cache line pair (adjacent-line prefetch makes 128 the unit that
/// avoids false sharing on x86).
#[repr(C, align(128))]
#[derive(Debug, Default)]
pub struct Padded<T>(pub T);

/// The header of a segment.
#[repr(C)]
#[derive(Debug)]
pub struct Header {
    /// [`MAGIC`] once the owner has initialised the segment.
    pub magic: AtomicU64,
    /// Owner's global rank.
    pub rank: AtomicU64,
    /// Owner's process id (for liveness checks by peers).
    pub pid: AtomicU64,
    /// Heap size in bytes.
    pub heap_size: AtomicU64,
    /// Why the owner left on purpose: [`OPEN`] while it runs, [`CLOSED`] once it dropped its
    /// communicator, [`EXITED`] when its process exited with the communicator open. A rank
    /// killed by a signal leaves [`OPEN`] behind (its peers find its process gone instead).
    pub closed: AtomicU64,
    /// Bumped by anyone who changes something the owner may be waiting for; the owner sleeps
    /// on it as a futex.
    pub doorbell: Padded<AtomicU32>,
    /// Number of the owner's threads asleep (or about to sleep) on `doorbell`.
    pub sleepers: Padded<AtomicU32>,
}

/// Per-group state of one rank, found by peers through `key`.
#[repr(C)]
#[derive(Debug)]
pub struct GroupSlot {
    /// The group's id; 0 while the slot is free. Written last (release) when the slot is taken.
    pub key: AtomicU64,
    /// The group's size (guards against id collisions).
    pub nranks: AtomicU64,
    /// Number of barriers this rank has entered in the group.
    pub barrier: Padded<AtomicU64>,
    /// Sequence number of the allocation this rank is in (or last was in).
    pub alloc_seq: Padded<AtomicU64>,
    /// Bytes this rank asked for in allocation `alloc_seq`.
    pub alloc_bytes: AtomicU64,
    /// What request `alloc_seq` is: [`REQ_ALLOC`] or [`REQ_FREE`].
    pub req_kind: AtomicU64,
    /// Heap offset of the allocation a [`REQ_FREE`] request releases.
    pub req_offset: AtomicU64,
    /// Flags for the collectives of this group (meaning defined by the collectives).
    pub coll: Padded<[AtomicU64; COLL_WORDS]>,
}

/// Byte layout of a segment: control area, then the heap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Offset of the group slot table.
    pub slots: usize,
    /// Offset of the allocation bitmap (one bit per granule, 1 = in use).
    pub bitmap: usize,
    /// Number of 64-bit bitmap words.
    pub bitmap_words: usize,
    /// Offset of the dropped bitmap (`bitmap_words` words; bit = first granule of an
    /// allocation the rank has dropped without freeing it).
    pub dropped: usize,
    /// Offset of the flight-recorder ring (64-byte aligned).
    pub recorder: usize,
    /// Records in the ring (0: no recorder).
    pub recorder_entries: usize,
    /// Offset of the heap (page aligned).
    pub heap: usize,
    /// Heap size in bytes (a multiple of [`GRANULE`]).
    pub heap_size: usize,
    /// Whole segment.
    pub total: usize,
}

impl Layout {
    /// The layout for a heap of at least `heap_size` bytes (rounded up to the granule) and a
    /// flight recorder of `recorder_entries` records.
    pub fn new(heap_size: usize, recorder_entries: usize) -> Layout {
        let heap_size = heap_size.div_ceil(GRANULE) * GRANULE;
        let slots = std::mem::size_of::<Header>().next_multiple_of(128);
        let bitmap = slots + MAX_GROUPS * std::mem::size_of::<GroupSlot>();
        let granules = heap_size / GRANULE;
        let bitmap_words = granules.div_ceil(64);
        let dropped = bitmap + bitmap_words * 8;
        let recorder = (dropped + bitmap_words * 8).next_multiple_of(128);
        let heap = (recorder + FlightRing::bytes_for(recorder_entries)).next_multiple_of(GRANULE);
        Layout {
            slots,
            bitmap,
            bitmap_words,
            dropped,
            recorder,
            recorder_entries,
            heap,
            heap_size,
            total: heap + heap_size,
        }
    }
}

/// Typed access to one mapped segment, borrowed from its mapping.
#[derive(Clone, Copy, Debug)]
pub struct Control<'a> {
    base: *mut u8,
    layout: Layout,
    _map: PhantomData<&'a Mapping>,
}

impl<'a> Control<'a> {
    /// Typed view of a segment mapping made for `layout`.
    ///
    /// Panics if the mapping is shorter than the layout (a programming error).
    #[inline]
    pub fn of(map: &'a Mapping, layout: Layout) -> Control<'a> {
        assert!(map.len() >= layout.total, "segment mapping shorter than its layout");
        Control { base: map.base(), layout, _map: PhantomData }
    }

    /// The header.
    #[inline]
    pub fn header(&self) -> &'a Header {
        // SAFETY: the header sits at offset 0 of a mapping that lives for 'a (borrowed), is
        // suitably aligned (page-aligned base) and consists only of atomics.
        unsafe { &*self.base.cast::<Header>() }
    }

    /// Group slot `i` (< [`MAX_GROUPS`]).
    pub fn slot(&self, i: usize) -> &'a GroupSlot {
        assert!(i < MAX_GROUPS, "group slot index {i} out of range");
        // SAFETY: slot `i` lies inside the slot table of the mapping (live for 'a); GroupSlot is
        // 128-aligned and `layout.slots` is a multiple of 128 from a page-aligned base.
        unsafe { &*self.base.add(self.layout.slots).cast::<GroupSlot>().add(i) }
    }

    /// The allocation bitmap words.
    pub fn bitmap(&self) -> &'a [AtomicU64] {
        // SAFETY: the bitmap lies inside the mapping (live for 'a), 8-aligned, `bitmap_words` long, and
        // holds only atomics.
        unsafe {
            std::slice::from_raw_parts(self.base.add(self.layout.bitmap).cast::<AtomicU64>(), self.layout.bitmap_words)
        }
    }

    /// The dropped bitmap words (same indexing as [`Control::bitmap`]).
    pub fn dropped(&self) -> &'a [AtomicU64] {
        // SAFETY: the dropped bitmap lies inside the mapping (live for 'a) right after the
        // allocation bitmap, 8-aligned, `bitmap_words` long, and holds only atomics.
        unsafe {
            std::slice::from_raw_parts(self.base.add(self.layout.dropped).cast::<AtomicU64>(), self.layout.bitmap_words)
        }
    }

    /// The flight-recorder ring, when the layout has one.
    #[inline]
    pub fn ring(&self) -> Option<FlightRing<'a>> {
        (self.layout.recorder_entries > 0).then(|| {
            // SAFETY: the ring lies inside the mapping (live for 'a) at a 128-aligned offset from
            // a page-aligned base, `bytes_for(recorder_entries)` long, zero-filled at creation
            // and accessed only through the ring's atomics by every process.
            unsafe { FlightRing::from_raw(self.base.add(self.layout.recorder), self.layout.recorder_entries) }
        })
    }

    /// First byte of the heap.
    pub fn heap(&self) -> *mut u8 {
        // SAFETY: `layout.heap` is inside the mapping.
        unsafe { self.base.add(self.layout.heap) }
    }

    /// The layout.
    pub fn layout(&self) -> Layout {
        self.layout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_aligned_and_disjoint() {
        for (heap, entries) in [(1usize, 0), (4096, 1), (1 << 20, 64), ((1 << 30) + 5, 1000)] {
            let l = Layout::new(heap, entries);
            assert!(l.heap_size >= heap && l.heap_size.is_multiple_of(GRANULE));
            assert!(l.slots >= std::mem::size_of::<Header>() && l.slots.is_multiple_of(128));
            assert!(l.bitmap >= l.slots + MAX_GROUPS * std::mem::size_of::<GroupSlot>());
            assert!(l.dropped >= l.bitmap + l.bitmap_words * 8);
            assert!(l.recorder >= l.dropped + l.bitmap_words * 8 && l.recorder.is_multiple_of(64));
            assert!(l.heap >= l.recorder + FlightRing::bytes_for(entries) && l.heap.is_multiple_of(GRANULE));
            assert!(l.bitmap_words * 64 >= l.heap_size / GRANULE);
        }
    }
}
