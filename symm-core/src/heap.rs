//! What a rank's symmetric heap holds: the figures a backend that keeps the accounting reports
//! (the CPU backend's `heap_stats`, Python's `memory_stats`).

use crate::rank::Rank;

/// One rank's use of its heap (a backend's report of it, e.g. the CPU backend's `heap_stats`). Sizes are in bytes, rounded up to
/// the allocation granule (what the allocations take of the heap).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeapStats {
    /// The heap's size.
    pub heap_size: usize,
    /// Held by allocations: `in_use + dropped`.
    pub reserved: usize,
    /// Held by allocations this rank still holds.
    pub in_use: usize,
    /// Held by allocations this rank has dropped (abandoned) that wait for the other members
    /// of their group to drop them too; they come back at the group's next allocation after.
    pub dropped: usize,
    /// Not reserved.
    pub free: usize,
    /// The longest free range of this rank's heap (an allocation in a group also needs the
    /// same range free on the other members).
    pub largest_free: usize,
    /// Live allocations (dropped ones included).
    pub allocations: usize,
    /// The same figures per group that holds any allocation.
    pub groups: Vec<GroupHeapStats>,
}

/// One group's share of a rank's heap.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupHeapStats {
    /// The group's global ranks, in group order.
    pub ranks: Vec<Rank>,
    /// Held by the group's allocations.
    pub reserved: usize,
    /// Held by those this rank still holds.
    pub in_use: usize,
    /// Held by those this rank dropped, waiting for the other members.
    pub dropped: usize,
    /// Number of the group's live allocations.
    pub allocations: usize,
}
