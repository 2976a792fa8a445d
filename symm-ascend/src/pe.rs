//! Groups as SHMEM sees them: which PEs a group's ranks are, and whether a SHMEM team can stand
//! for the group.
//!
//! symm's world rank `r` is SHMEM PE `r` (the unique-id start-up gives every rank its own rank
//! as PE number), so the group's rank list *is* its PE table, and translating a group rank to a
//! PE is a lookup in it. SHMEM teams only split strided (`start, start + stride, ...`), and each
//! split takes an index every PE must allocate in the same order (R9): a group whose ranks are
//! strided, in increasing order, can use a team for its on-stream barrier; any other ordered
//! list (a torch group `[0, 3, 5]`, a reversed ring) uses the table and symm's own signals.

use symm_core::Rank;

/// How a group reaches its PEs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TeamPlan {
    /// Every PE, in order: SHMEM's world team.
    World,
    /// A strided split of the world: `size` PEs from `start`, `stride` apart (stride >= 1).
    Strided { start: i32, stride: i32, size: i32 },
    /// No team expresses it: the group's rank table, with symm's own signals.
    Table,
}

/// The plan for the group of `ranks` (global, in group order) in a world of `world_size`.
pub fn team_plan(ranks: &[Rank], world_size: usize) -> TeamPlan {
    let pes: Vec<i64> = ranks.iter().map(|r| i64::from(r.0)).collect();
    if pes.len() == world_size && pes.iter().enumerate().all(|(i, &p)| p == i as i64) {
        return TeamPlan::World;
    }
    let Some(&start) = pes.first() else { return TeamPlan::Table };
    let stride = if pes.len() > 1 { pes[1] - pes[0] } else { 1 };
    let strided = stride >= 1 && pes.windows(2).all(|w| w[1] - w[0] == stride);
    match (strided, i32::try_from(start), i32::try_from(stride), i32::try_from(pes.len())) {
        (true, Ok(start), Ok(stride), Ok(size)) => TeamPlan::Strided { start, stride, size },
        _ => TeamPlan::Table,
    }
}

/// The SHMEM PE of global rank `rank`.
pub fn pe_of(rank: Rank) -> i32 {
    // World sizes are bounded far below i32::MAX (SYMM_WORLD_SIZE <= 2^20).
    rank.0 as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(v: &[u32], n: usize) -> TeamPlan {
        team_plan(&v.iter().map(|&r| Rank(r)).collect::<Vec<_>>(), n)
    }

    #[test]
    fn groups_use_a_team_only_where_one_expresses_them() {
        assert_eq!(plan(&[0, 1, 2, 3], 4), TeamPlan::World);
        assert_eq!(plan(&[0, 1, 2, 3], 8), TeamPlan::Strided { start: 0, stride: 1, size: 4 });
        assert_eq!(plan(&[0, 2, 4, 6], 8), TeamPlan::Strided { start: 0, stride: 2, size: 4 });
        assert_eq!(plan(&[1, 3, 5, 7], 8), TeamPlan::Strided { start: 1, stride: 2, size: 4 });
        assert_eq!(plan(&[5], 8), TeamPlan::Strided { start: 5, stride: 1, size: 1 });
        // An ordered list a team cannot express: uneven, decreasing, or permuted.
        assert_eq!(plan(&[0, 3, 5], 8), TeamPlan::Table);
        assert_eq!(plan(&[3, 2, 1, 0], 4), TeamPlan::Table);
        assert_eq!(plan(&[1, 0, 2, 3], 4), TeamPlan::Table);
        assert_eq!(plan(&[], 4), TeamPlan::Table);
    }

    #[test]
    fn a_rank_is_its_own_pe() {
        assert_eq!(pe_of(Rank(0)), 0);
        assert_eq!(pe_of(Rank(7)), 7);
    }
}
