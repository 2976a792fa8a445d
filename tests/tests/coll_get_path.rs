//! The collectives through `get` instead of direct loads: the path a backend without
//! load/store access to peers' heaps takes. Same cases, same checks.

#[test]
fn collectives_through_get() {
    // This test binary holds this single test, so the environment is set before any rank
    // exists and nothing else reads it concurrently.
    std::env::set_var("SYMM_COLL_ACCESS", "get");
    std::env::set_var("SYMM_COLL_WORKSPACE", "256K");
    std::env::set_var("SYMM_ALLREDUCE_ONESHOT_MAX", "16K");
    std::env::set_var("SYMM_TEST_CASES", "10");
    symm_tests::coll_cases_on_threads(&[2, 3, 5]);
}
