//! A rank killed with SIGKILL in the middle of a job: the survivors blocked on it get
//! `Error::PeerLost` naming it quickly (not a timeout much later), and the job leaves nothing
//! behind: no new entry in `/dev/shm` (the heaps are memfds) and no process.
//!
//! Three processes run `symm-fault-rank` (see `src/bin/symm-fault-rank/main.rs`); rank 2 kills
//! itself after the first world barrier while ranks 0 and 1 wait for it.

#[path = "../src/bin/symm-fault-rank/codes.rs"]
mod codes;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::Duration;
use symm_tests::debris::{run_job as run_ranks, Job};

const RANKS: usize = 3;
const VICTIM: usize = 2;
/// Bound on each survivor's detection (it checks peers every 100 ms while it sleeps).
const DETECT_LIMIT_MS: u64 = 3000;
/// The wait bound of the job: detection must come long before it.
const WAIT_BOUND_S: u64 = 60;
/// Bound on the whole job, start-up included (far below `WAIT_BOUND_S`).
const JOB_LIMIT: Duration = Duration::from_secs(8);

fn run_job(mode: &str) {
    let exe = Path::new(env!("CARGO_BIN_EXE_symm-fault-rank"));
    let wait = WAIT_BOUND_S.to_string();
    let env = [("SYMMETRIC_MEMORY_HEAP_SIZE", "4M"), ("SYMMETRIC_MEMORY_TIMEOUT", &wait)];
    let args = [VICTIM.to_string(), DETECT_LIMIT_MS.to_string(), mode.to_string()];
    // Grace well below the wait bound: survivors that hang are killed (and reported as such)
    // instead of ending in a timeout error. The job must leave no process and no /dev/shm entry
    // behind (the heaps are memfds).
    let Job { statuses, took } = run_ranks(mode, RANKS, exe, &args, &env, Duration::from_secs(20));

    assert_eq!(
        statuses[VICTIM].signal(),
        Some(libc::SIGKILL),
        "{mode}: rank {VICTIM} should have died of SIGKILL, it ended with {}",
        statuses[VICTIM]
    );
    for (r, st) in statuses.iter().enumerate().filter(|&(r, _)| r != VICTIM) {
        let code = st.code();
        assert_eq!(
            code,
            Some(codes::DETECTED),
            "{mode}: rank {r} ended with {st} ({}); expected PeerLost naming rank {VICTIM} within {DETECT_LIMIT_MS} ms",
            code.map_or("killed by a signal: it hung", codes::describe)
        );
    }
    assert!(
        took < JOB_LIMIT,
        "{mode}: the job took {took:?}; the survivors must notice the lost rank in well under the {WAIT_BOUND_S} s wait bound"
    );
}

#[test]
fn survivors_of_a_killed_rank_leave_a_barrier_with_peer_lost() {
    run_job("barrier");
}

#[test]
fn survivors_of_a_killed_rank_leave_wait_until_with_peer_lost() {
    run_job("wait_until");
}
