//! The collectives with streaming (non-temporal) stores for every output, however small: the
//! path large calls take (`SYMM_STREAM_STORES_MIN`), checked on the conformance cases, with a
//! small workspace so that calls also run in several rounds.

#[test]
fn collectives_with_streaming_stores() {
    // This test binary holds this single test, so the environment is set before any rank
    // exists and nothing else reads it concurrently.
    std::env::set_var("SYMM_STREAM_STORES_MIN", "1");
    std::env::set_var("SYMM_COLL_WORKSPACE", "256K");
    std::env::set_var("SYMM_TEST_CASES", "10");
    symm_tests::coll_cases_on_threads(&[2, 3]);
}
