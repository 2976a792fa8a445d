//! Two kinds of rank, two types: mixing them is the classic bug of group-aware APIs.
//!
//! [`Rank`] is a process's rank in the whole job (the world); [`GroupRank`] is a position inside
//! one [`Group`](crate::Group). The only conversions are `Group::to_global` and `Group::to_local`.

use std::fmt;

/// A rank in the world (the whole job).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Rank(pub u32);

/// A rank inside one group: `0..group.size()`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupRank(pub u32);

impl Rank {
    /// The rank of an error raised before the process knows its rank (a bad `SYMM_RANK`):
    /// shown as `unknown`.
    pub const UNKNOWN: Rank = Rank(u32::MAX);

    /// As an index.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl GroupRank {
    /// As an index.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for Rank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Rank::UNKNOWN {
            f.write_str("unknown")
        } else {
            write!(f, "{}", self.0)
        }
    }
}

impl fmt::Display for GroupRank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

// Debug prints the bare number so that rank lists in messages read `[0, 2, 3]`.
impl fmt::Debug for Rank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Debug for GroupRank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
