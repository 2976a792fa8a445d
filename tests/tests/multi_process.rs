//! The conformance suite with one process per rank, for 2, 3, 4 and 8 ranks.

use std::time::Duration;

fn run(cases: &[&str], n: usize) {
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_symm-conformance-rank"));
    let args: Vec<String> = cases.iter().map(|s| s.to_string()).collect();
    let env = vec![
        ("SYMMETRIC_MEMORY_HEAP_SIZE".to_string(), "32M".to_string()),
        ("SYMMETRIC_MEMORY_TIMEOUT".to_string(), "60".to_string()),
        ("SYMM_COLL_WORKSPACE".to_string(), "1M".to_string()),
        ("SYMM_ALLREDUCE_ONESHOT_MAX".to_string(), "32K".to_string()),
        ("SYMM_TEST_CASES".to_string(), "8".to_string()),
    ];
    let statuses = symm_sim::spawn_ranks(n, exe, &args, &env, Duration::from_secs(5)).expect("spawn ranks");
    for (r, st) in statuses.iter().enumerate() {
        assert!(st.success(), "{n} ranks, cases {cases:?}: rank {r} ended with {st}");
    }
}

#[test]
fn every_case_on_2_3_4_and_8_processes() {
    let all: Vec<&str> = symm_tests::CASES.iter().chain(symm_tests::COLL_CASES).copied().collect();
    for n in [2, 3, 4, 8] {
        run(&all, n);
    }
}
