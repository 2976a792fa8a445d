//! `Comm::heap_stats`: what a rank reserves, holds, has dropped and has free, per group, as
//! allocations come, are abandoned by some members and then by all, and are reclaimed.

use symm_core::HeapStats;
use symm_core::{Backend, Communicator, DType, SymmetricHeap};
use symm_registry::{BackendControl, Comm, CommConfig};

const GRANULE: usize = 4096;

fn world_share(s: &HeapStats, comm: &Comm) -> (usize, usize, usize, usize) {
    let g = s.groups.iter().find(|g| g.ranks == comm.world().ranks()).expect("the world holds allocations");
    (g.reserved, g.in_use, g.dropped, g.allocations)
}

fn check_totals(s: &HeapStats) {
    assert_eq!(s.reserved, s.in_use + s.dropped, "{s:?}");
    assert_eq!(s.free, s.heap_size - s.reserved, "{s:?}");
    assert!(s.largest_free <= s.free, "{s:?}");
    assert_eq!(s.reserved, s.groups.iter().map(|g| g.reserved).sum::<usize>(), "{s:?}");
    assert_eq!(s.allocations, s.groups.iter().map(|g| g.allocations).sum::<usize>(), "{s:?}");
}

#[test]
fn heap_stats_follow_allocations_drops_and_reclaims() {
    let mut config = CommConfig::with_heap_size(64 << 20);
    config.settings.timeout = std::time::Duration::from_secs(30);
    symm_tests::on_threads("heap statistics", 2, config, |comm| {
        let me = comm.rank().index();
        let world = comm.world();
        let base = comm.heap_stats().unwrap();
        check_totals(&base);
        assert_eq!(base.dropped, 0);
        let (r0, u0, _, n0) = world_share(&base, &comm);

        // 10000 bytes take three granules.
        let a = comm.alloc(&world, 10_000, DType::U8).expect("a");
        let s = comm.heap_stats().unwrap();
        check_totals(&s);
        assert_eq!(world_share(&s, &comm), (r0 + 3 * GRANULE, u0 + 3 * GRANULE, 0, n0 + 1), "rank {me}: {s:?}");
        assert_eq!(s.reserved, base.reserved + 3 * GRANULE);

        // Rank 0 drops it: counted as dropped there at once, still reserved everywhere.
        let a = if me == 0 {
            comm.abandon(a).expect("abandon");
            None
        } else {
            Some(a)
        };
        let s = comm.heap_stats().unwrap();
        check_totals(&s);
        let dropped = if me == 0 { 3 * GRANULE } else { 0 };
        assert_eq!(world_share(&s, &comm), (r0 + 3 * GRANULE, u0 + 3 * GRANULE - dropped, dropped, n0 + 1));

        // The next allocation cannot reclaim it (rank 1 still holds it).
        let b = comm.alloc(&world, GRANULE, DType::U8).expect("b");
        let s = comm.heap_stats().unwrap();
        check_totals(&s);
        assert_eq!(world_share(&s, &comm), (r0 + 4 * GRANULE, u0 + 4 * GRANULE - dropped, dropped, n0 + 2));

        // Rank 1 drops it too; the group's next allocation (even of nothing) reclaims it.
        if let Some(a) = a {
            comm.abandon(a).expect("abandon");
        }
        let _ = comm.alloc(&world, 0, DType::U8).expect("empty allocation");
        let s = comm.heap_stats().unwrap();
        check_totals(&s);
        assert_eq!(world_share(&s, &comm), (r0 + GRANULE, u0 + GRANULE, 0, n0 + 1), "rank {me}: {s:?}");
        comm.free(b).expect("free b");
        let s = comm.heap_stats().unwrap();
        assert_eq!(world_share(&s, &comm), (r0, u0, 0, n0));
        assert_eq!((s.reserved, s.free, s.largest_free), (base.reserved, base.free, base.largest_free));
        comm.barrier(&world).expect("barrier");
    });
}
