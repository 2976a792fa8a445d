//! The collectives with streaming (non-temporal) stores for every output, however small: the
//! path large calls take (`SYMM_STREAM_STORES_MIN`), checked on the conformance cases, with a
//! small workspace so that calls also run in several rounds.

use symm_sim::{run_in_process, SimConfig};

#[test]
fn collectives_with_streaming_stores() {
    // This test binary holds this single test, so the environment is set before any rank
    // exists and nothing else reads it concurrently.
    std::env::set_var("SYMM_STREAM_STORES_MIN", "1");
    std::env::set_var("SYMM_COLL_WORKSPACE", "256K");
    std::env::set_var("SYMM_TEST_CASES", "10");
    for n in [2, 3] {
        for case in symm_tests::COLL_CASES {
            let config = SimConfig::with_heap_size(64 << 20);
            for (r, res) in run_in_process(n, config, |comm| symm_tests::run_case(case, &comm)).into_iter().enumerate()
            {
                res.unwrap_or_else(|e| panic!("{case} on {n} ranks: rank {r} failed to start: {e}"));
            }
        }
    }
}
