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
use std::time::{Duration, Instant};
use symm_tests::debris::{processes_with_env, shm_entries};

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
    // A tag in the ranks' environment finds any rank still alive after the job.
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
    let tag_value = format!("{}-{mode}-{nanos}", std::process::id());
    let tag = format!("SYMM_FAULT_TEST_JOB={tag_value}");
    let env = vec![
        ("SYMMETRIC_MEMORY_HEAP_SIZE".to_string(), "4M".to_string()),
        ("SYMMETRIC_MEMORY_TIMEOUT".to_string(), WAIT_BOUND_S.to_string()),
        ("SYMM_FAULT_TEST_JOB".to_string(), tag_value),
    ];
    let args = vec![VICTIM.to_string(), DETECT_LIMIT_MS.to_string(), mode.to_string()];
    let shm_before = shm_entries();

    let start = Instant::now();
    // Grace well below the wait bound: survivors that hang are killed (and reported as such)
    // instead of ending in a timeout error.
    let statuses =
        symm_sim::spawn_ranks(RANKS, exe, &args, &env, Duration::from_secs(20)).expect("starting symm-fault-rank");
    let took = start.elapsed();

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

    let shm_after = shm_entries();
    let new: Vec<&String> = shm_after.difference(&shm_before).collect();
    assert!(
        new.is_empty(),
        "{mode}: the job left new entries in /dev/shm: {new:?} (the backend must use anonymous memfds; if another \
         program created them at the same time, rerun)"
    );
    let left = processes_with_env(&tag);
    assert!(left.is_empty(), "{mode}: processes of the job are still running after it ended: pids {left:?}");
}

#[test]
fn survivors_of_a_killed_rank_leave_a_barrier_with_peer_lost() {
    run_job("barrier");
}

#[test]
fn survivors_of_a_killed_rank_leave_wait_until_with_peer_lost() {
    run_job("wait_until");
}
