//! Members that disagree on which collective they run, or on a small broadcast's root, where the
//! small-broadcast root returns without waiting (`symm-protocol-rank` runs the ranks and checks
//! what each one saw; see `src/bin/symm-protocol-rank.rs`):
//! - self-declared roots of one broadcast (2 ranks: each names itself; 3 ranks: two name rank
//!   0, one names itself): every rank gets `Mismatch`, at the latest in its next collective,
//!   with and without `SYMM_VALIDATE=1` (with it, in the broadcast itself);
//! - a small broadcast on one rank against an allreduce on the others: the others get
//!   `Mismatch` naming the broadcast within 2 s, not at the 60 s wait bound, and the
//!   broadcaster gets it in its next collective;
//! - the same with the broadcaster making the others' call 100 ms later: the calls pair as
//!   before (the allreduces fail naming the broadcasts made before them) and the group stays
//!   usable;
//! - a rank whose collective timed out (and which then takes no more collectives in the group):
//!   its late peer completes that call and gets a `Timeout` naming it in the next one within
//!   2 s, not at the 60 s wait bound;
//! - under `SYMM_VALIDATE=1`, a rank that skipped a broadcast whose root differs from the next
//!   one's: every rank gets `Mismatch` in that call, naming both roots.
//!
//! Every job must leave nothing behind in `/dev/shm`.

use std::path::Path;
use std::time::Duration;
use symm_tests::debris::run_job as run_ranks;

/// Bound on each rank's detection of the disagreement.
const DETECT_LIMIT_MS: u64 = 2000;
/// The wait bound of the jobs: every detection must come long before it.
const WAIT_BOUND_S: u64 = 60;

fn run_job(mode: &str, ranks: usize, extra: &[(&str, &str)]) {
    let exe = Path::new(env!("CARGO_BIN_EXE_symm-protocol-rank"));
    let wait = WAIT_BOUND_S.to_string();
    let mut env = vec![
        ("SYMMETRIC_MEMORY_HEAP_SIZE", "8M"),
        ("SYMMETRIC_MEMORY_TIMEOUT", &wait),
        ("SYMM_COLL_WORKSPACE", "256K"),
    ];
    env.extend_from_slice(extra);
    let args = [mode.to_string(), DETECT_LIMIT_MS.to_string()];
    let what = format!("{mode} on {ranks} ranks {extra:?}");
    // Grace well below the wait bound: ranks that hang are killed and reported as such.
    let job = run_ranks(&what, ranks, exe, &args, &env, Duration::from_secs(15));
    for (r, st) in job.statuses.iter().enumerate() {
        assert!(st.success(), "{what}: rank {r} ended with {st} (see its CHECK FAILED lines above)");
    }
    let took = job.took;
    assert!(took < Duration::from_secs(20), "{what}: the job took {took:?} (wait bound {WAIT_BOUND_S} s)");
}

#[test]
fn self_declared_broadcast_roots_fail_on_every_rank() {
    run_job("roots", 2, &[]);
    run_job("roots", 3, &[]);
    run_job("roots", 3, &[("SYMM_PROTOCOL_ROOTS", "self")]);
}

#[test]
fn self_declared_broadcast_roots_fail_in_the_broadcast_under_validation() {
    run_job("roots", 2, &[("SYMM_VALIDATE", "1")]);
    run_job("roots", 3, &[("SYMM_VALIDATE", "1")]);
}

#[test]
fn a_small_broadcast_against_an_allreduce_fails_within_two_seconds_on_every_rank() {
    run_job("other-call", 2, &[]);
    run_job("other-call", 3, &[]);
}

#[test]
fn a_root_that_makes_the_others_call_soon_after_pairs_as_before_and_the_group_stays_usable() {
    run_job("late-order", 2, &[]);
    run_job("late-order", 3, &[]);
}

#[test]
fn a_rank_whose_collective_timed_out_tells_its_late_peer_at_once() {
    run_job("gave-up", 2, &[]);
}

#[test]
fn a_skipped_broadcast_whose_root_differs_fails_under_validation() {
    run_job("skip", 2, &[("SYMM_VALIDATE", "1")]);
}
