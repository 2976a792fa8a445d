//! The collective conformance cases with validation mode on (`SYMM_VALIDATE=1`) and a flight
//! recorder of one record (it wraps on every operation): neither may change any result or raise
//! an error that the cases do not expect.

use std::time::Duration;

fn run(n: usize, extra: &[(&str, &str)]) {
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_symm-conformance-rank"));
    let args: Vec<String> = symm_tests::COLL_CASES.iter().map(|s| s.to_string()).collect();
    let mut env = vec![
        // The coll_groups case holds up to five groups per rank; on 8 ranks each takes up to
        // 14 MiB with these settings (mailboxes of 1 MiB per member, eager broadcast rings of
        // 516 KiB per member where ranks share cores).
        ("SYMMETRIC_MEMORY_HEAP_SIZE".to_string(), "64M".to_string()),
        ("SYMMETRIC_MEMORY_TIMEOUT".to_string(), "60".to_string()),
        ("SYMM_COLL_WORKSPACE".to_string(), "1M".to_string()),
        ("SYMM_ALLREDUCE_ONESHOT_MAX".to_string(), "32K".to_string()),
        ("SYMM_TEST_CASES".to_string(), "4".to_string()),
    ];
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let statuses = symm_sim::spawn_ranks(n, exe, &args, &env, Duration::from_secs(5)).expect("spawn ranks");
    for (r, st) in statuses.iter().enumerate() {
        assert!(st.success(), "{n} ranks, {extra:?}: rank {r} ended with {st}");
    }
}

#[test]
fn collectives_pass_their_cases_in_validation_mode() {
    for n in [2, 3, 4] {
        run(n, &[("SYMM_VALIDATE", "1")]);
    }
}

#[test]
fn collectives_pass_their_cases_with_a_one_record_flight_recorder() {
    run(3, &[("SYMM_FLIGHT_RECORDER_ENTRIES", "1"), ("SYMM_LOG_LEVEL", "off")]);
}
