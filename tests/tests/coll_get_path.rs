//! The collectives through `get` instead of direct loads: the path a backend without
//! load/store access to peers' heaps takes. Same cases, same checks.

use symm_sim::{run_in_process, SimConfig};

#[test]
fn collectives_through_get() {
    // This test binary holds this single test, so the environment is set before any rank
    // exists and nothing else reads it concurrently.
    std::env::set_var("SYMM_COLL_ACCESS", "get");
    std::env::set_var("SYMM_COLL_WORKSPACE", "256K");
    std::env::set_var("SYMM_ALLREDUCE_ONESHOT_MAX", "16K");
    std::env::set_var("SYMM_TEST_CASES", "10");
    for n in [2, 3, 5] {
        for case in symm_tests::COLL_CASES {
            let config = SimConfig::with_heap_size(64 << 20);
            for (r, res) in run_in_process(n, config, |comm| symm_tests::run_case(case, &comm)).into_iter().enumerate()
            {
                res.unwrap_or_else(|e| panic!("{case} on {n} ranks: rank {r} failed to start: {e}"));
            }
        }
    }
}
