//! The conformance suite with one process per rank, for 2, 3, 4 and 8 ranks, and under settings
//! that must not change its results.

use std::time::Duration;

fn run(cases: &[&str], n: usize) {
    run_with(cases, n, &[]);
}

fn run_with(cases: &[&str], n: usize, extra_env: &[(&str, &str)]) {
    let exe = std::path::Path::new(env!("CARGO_BIN_EXE_symm-conformance-rank"));
    let args: Vec<String> = cases.iter().map(|s| s.to_string()).collect();
    let mut env = vec![
        // The coll_groups case holds up to five groups per rank; on 8 ranks each takes up to
        // 14 MiB with these settings (mailboxes of 1 MiB per member, eager broadcast rings of
        // 516 KiB per member where ranks share cores).
        ("SYMMETRIC_MEMORY_HEAP_SIZE".to_string(), "64M".to_string()),
        ("SYMMETRIC_MEMORY_TIMEOUT".to_string(), "60".to_string()),
        ("SYMM_COLL_WORKSPACE".to_string(), "1M".to_string()),
        ("SYMM_ALLREDUCE_ONESHOT_MAX".to_string(), "32K".to_string()),
        ("SYMM_TEST_CASES".to_string(), "8".to_string()),
    ];
    env.extend(extra_env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let statuses = symm_registry::spawn_ranks(n, exe, &args, &env, Duration::from_secs(5)).expect("spawn ranks");
    for (r, st) in statuses.iter().enumerate() {
        assert!(st.success(), "{n} ranks, cases {cases:?}, {extra_env:?}: rank {r} ended with {st}");
    }
}

#[test]
fn every_case_on_2_3_4_and_8_processes() {
    let all: Vec<&str> = symm_tests::CASES.iter().chain(symm_tests::COLL_CASES).copied().collect();
    for n in [2, 3, 4, 8] {
        run(&all, n);
    }
}

#[test]
fn members_that_disagree_on_the_small_message_path() {
    // Rank by rank limits of the small-message path: calls that some members send on the small
    // path and others through the round protocol, in every pattern (one member always on the
    // round protocol; limits that split the sizes between 64 B and 4 KiB). Every call must
    // complete with the same results (or errors) as when all agree. Then every member at the
    // largest limit (messages up to 4 KiB on the small path) and with the path off.
    for (n, limits) in [(2, "4096,64"), (3, "4096,0,64"), (4, "64,4096,4096,1K"), (3, "4096"), (2, "0")] {
        run_with(symm_tests::COLL_CASES, n, &[("SYMM_TEST_LL_MAX_BY_RANK", limits)]);
    }
}

#[test]
fn eager_broadcasts_at_either_limit_or_none() {
    // The eager limit follows the placement (256 B with a core per rank, 8 KiB where ranks
    // share cores); set here, so that both limits (and none) run on any machine.
    for (n, limit) in [(2, "8K"), (3, "256"), (2, "0")] {
        run_with(symm_tests::COLL_CASES, n, &[("SYMM_BCAST_EAGER_MAX", limit)]);
    }
}

#[test]
fn every_wait_asleep_with_light_fenced_and_mixed_signals() {
    // No spinning and no yielding in the backend's waits (symm-core still polls briefly before
    // it calls them): a wait not met by then sleeps on its doorbell, so every signal must wake
    // its sleeper: light signals (the sleeper's membarrier), fenced ones, and ranks of both
    // kinds together. Naps of 5 s instead of 100 ms make a lost wake-up tell: each rank fails if
    // one of its waits slept a nap out and then found its condition met (unless another ring
    // ended that nap first: see `symm_registry::host::lost_wakeups`).
    let all: Vec<&str> = symm_tests::CASES.iter().chain(symm_tests::COLL_CASES).copied().collect();
    for light in ["1", "0", "1,0,0"] {
        run_with(
            &all,
            3,
            &[
                ("SYMM_SPIN_US", "0"),
                ("SYMM_YIELD_US", "0"),
                ("SYMM_TEST_LIGHT_SIGNALS_BY_RANK", light),
                ("SYMM_TEST_NAP_MS", "5000"),
            ],
        );
    }
}

#[test]
fn collectives_pass_their_cases_in_validation_mode_and_with_a_one_record_flight_recorder() {
    // Neither may change any result or raise an error that the cases do not expect; the
    // recorder of one record wraps on every operation.
    for n in [2, 3, 4] {
        run_with(symm_tests::COLL_CASES, n, &[("SYMM_VALIDATE", "1"), ("SYMM_TEST_CASES", "4")]);
    }
    let recorder = [("SYMM_FLIGHT_RECORDER_ENTRIES", "1"), ("SYMM_LOG_LEVEL", "off"), ("SYMM_TEST_CASES", "4")];
    run_with(symm_tests::COLL_CASES, 3, &recorder);
}

/// The stream-ordered model of the CPU backend (`SYMM_EXECUTION=stream`): every blocking call
/// runs on the rank's default stream and is waited for, with each stream operation delayed at
/// random, so that results come from the order alone.
#[test]
fn every_case_in_the_stream_ordered_model() {
    let all: Vec<&str> = symm_tests::CASES.iter().chain(symm_tests::COLL_CASES).copied().collect();
    for n in [2, 3] {
        run_with(&all, n, &[("SYMM_EXECUTION", "stream"), ("SYMM_STREAM_DELAY_US", "20")]);
    }
}

/// The reference collectives (`SYMM_COLLECTIVES=reference`): every case, across processes, in
/// the host model on 2 and 3 ranks and in the stream-ordered one on 2.
#[test]
fn every_case_on_the_reference_collectives() {
    let all: Vec<&str> = symm_tests::CASES.iter().chain(symm_tests::COLL_CASES).copied().collect();
    let reference = [("SYMM_COLLECTIVES", "reference"), ("SYMM_TEST_CASES", "4")];
    for n in [2, 3] {
        run_with(&all, n, &reference);
    }
    let streamed = [reference[0], reference[1], ("SYMM_EXECUTION", "stream"), ("SYMM_STREAM_DELAY_US", "20")];
    run_with(&all, 2, &streamed);
}

#[test]
fn the_device_cases_with_every_buffer_in_the_heap_on_the_reference_collectives() {
    // What scripts/ascend-check.sh runs on an Ascend node (where the heap is device memory and
    // the collectives are the reference ones), here on the CPU backend.
    for n in [2, 3] {
        run_with(symm_tests::DEVICE_CASES, n, &[("SYMM_TEST_HEAP_ONLY", "1"), ("SYMM_COLLECTIVES", "reference")]);
    }
}
