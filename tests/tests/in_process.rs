//! The conformance suite with ranks as threads of this process.

use std::sync::Once;

use symm_core::config::CollectiveEngine;
use symm_registry::{run_in_process, CommConfig};

static ENV: Once = Once::new();

fn run(case: &str, n: usize) {
    run_in(case, n, false, CollectiveEngine::Host);
}

/// `case` on `n` ranks; `streamed`: in the stream-ordered model (every blocking call on the
/// rank's default stream, each stream operation delayed at random); `collectives`: the
/// implementation of the collectives (`SYMM_COLLECTIVES`).
fn run_in(case: &str, n: usize, streamed: bool, collectives: CollectiveEngine) {
    ENV.call_once(|| {
        // A small workspace makes the collectives chunk and pipeline even for modest sizes.
        // Set once, before any rank exists (every test passes through here first).
        std::env::set_var("SYMM_COLL_WORKSPACE", "256K");
        std::env::set_var("SYMM_ALLREDUCE_ONESHOT_MAX", "16K");
        std::env::set_var("SYMM_P2P_CHUNK", "8K");
    });
    let mut config = CommConfig::with_heap_size(64 << 20);
    config.settings.timeout = std::time::Duration::from_secs(60);
    config.settings.stream_execution = streamed;
    config.settings.stream_delay = std::time::Duration::from_micros(if streamed { 20 } else { 0 });
    config.settings.collectives = collectives;
    symm_tests::on_threads(&format!("{case} on {n} ranks"), n, config, |comm| symm_tests::run_case(case, &comm));
}

macro_rules! case {
    ($name:ident) => {
        #[test]
        fn $name() {
            for n in [1, 2, 3, 4, 8] {
                run(stringify!($name), n);
            }
        }
    };
}

case!(primitives);
case!(signals);
case!(ordering);
case!(groups);
case!(bad_input);
case!(heap);
case!(heap_sources);
case!(allreduce);
case!(reduce_scatter);
case!(allgather);
case!(broadcast);
case!(small_broadcasts);
case!(alltoall);
case!(sendrecv);
case!(sendrecv_heap);
case!(sendrecv_both);
case!(coll_errors);
case!(coll_groups);

/// Low-precision results equal the RFC's pipeline bit for bit, at 1, 2, 3, 5 and 8 ranks.
#[test]
fn low_precision_pipeline() {
    for n in [1, 2, 3, 5, 8] {
        run("low_precision_pipeline", n);
    }
}

/// Groups larger than the small-group fast paths (more than 8 members keep their scratch on the
/// heap instead of the stack).
#[test]
fn allreduce_in_a_group_of_ten() {
    run("allreduce", 10);
}

/// A call's `before_blocking` runs in its own thread when the call waits (for a late peer, or
/// for the members to set up a group's state), and not in a call that never waits (1 rank), on
/// either implementation of the collectives.
#[test]
fn before_blocking_runs_when_a_call_waits() {
    for collectives in [CollectiveEngine::Host, CollectiveEngine::Reference] {
        before_blocking_runs_when_a_call_waits_on(collectives);
    }
}

fn before_blocking_runs_when_a_call_waits_on(collectives: CollectiveEngine) {
    use symm_core::{Backend, CollOptions, Collectives, LocalMut, ReduceOp};
    thread_local! {
        static CALLED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }
    fn count() {
        CALLED.set(CALLED.get() + 1);
    }
    let opts = CollOptions::default().with_before_blocking(count);
    let allreduce = |comm: &symm_registry::Comm| {
        let mut x = [1.0f32];
        comm.allreduce(&comm.world(), LocalMut::from(&mut x[..]), ReduceOp::Sum, &opts).expect("allreduce");
        x[0]
    };
    let mut config = CommConfig::with_heap_size(16 << 20);
    config.settings.timeout = std::time::Duration::from_secs(60);
    config.settings.collectives = collectives;
    let ranks = run_in_process(2, config.clone(), |comm| {
        allreduce(&comm);
        CALLED.set(0);
        if comm.rank().index() == 1 {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let sum = allreduce(&comm);
        (sum, CALLED.get())
    });
    let (sum, called) = ranks[0].as_ref().expect("rank 0 starts");
    assert_eq!(*sum, 2.0);
    assert!(*called >= 1, "{collectives:?}: rank 0 waited 100 ms for rank 1 without calling before_blocking");
    let single = run_in_process(1, config, |comm| {
        allreduce(&comm);
        CALLED.set(0);
        allreduce(&comm);
        CALLED.get()
    });
    assert_eq!(*single[0].as_ref().expect("rank 0 starts"), 0, "{collectives:?}: a 1-rank call never waits");
}

/// Every case in the stream-ordered model of the CPU backend.
#[test]
fn every_case_in_the_stream_ordered_model() {
    for case in symm_tests::CASES.iter().chain(symm_tests::COLL_CASES) {
        for n in [1, 2, 4] {
            run_in(case, n, true, CollectiveEngine::Host);
        }
    }
}

/// Every case on the reference collectives (`SYMM_COLLECTIVES=reference`, fewer random cases
/// each), in the host model on 1 to 3 ranks and in the stream-ordered one on 2.
#[test]
fn every_case_on_the_reference_collectives() {
    for case in symm_tests::CASES.iter().chain(symm_tests::COLL_CASES) {
        for n in [1, 2, 3] {
            run_in(case, n, false, CollectiveEngine::Reference);
        }
        run_in(case, 2, true, CollectiveEngine::Reference);
    }
}
