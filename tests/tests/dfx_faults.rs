//! Faults across processes and what every rank reports about them (`symm-dfx-rank` runs the
//! ranks and checks what each one saw; see `src/bin/symm-dfx-rank.rs`):
//! - a rank killed with SIGKILL in the middle of an allreduce loop: the others get `PeerLost`
//!   naming it within 2 s (far below the 60 s wait bound);
//! - a rank that leaves normally (drops its communicator, exits with it open, or returns from
//!   `main`): the others get `PeerExited` naming it within 2 s;
//! - a rank that never arrives: a timeout whose text names the op, the group, the sequence
//!   number and the missing rank, with the node's flight recorder attached and logged;
//! - under `SYMM_VALIDATE=1`: ranks out of step (different call counts) and alltoall split
//!   sizes that disagree fail on every rank, naming the rank and both values;
//! - `SYMM_DUMP_ON_SIGNAL=1`: SIGUSR1 prints the flight recorder to stderr;
//! - a second start-up in the same processes meets anew (the launcher's store outlives the
//!   first), and a bad `SYMM_RENDEZVOUS_HOSTED` fails start-up naming it.
//!
//! Every job must leave nothing behind: no new entry in `/dev/shm`, no process.

use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;
use symm_tests::debris;

/// Bound on each survivor's detection of a lost or exited peer (it checks every 100 ms).
const DETECT_LIMIT_MS: u64 = 2000;
/// The wait bound of the jobs: every detection must come long before it.
const WAIT_BOUND_S: u64 = 60;

fn exe() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_symm-dfx-rank"))
}

/// Runs `ranks` ranks of `symm-dfx-rank mode victim limit` with `extra` environment; checks
/// that the job took less than `job_limit` and left no process and no /dev/shm entry behind.
fn run_job(mode: &str, ranks: usize, victim: usize, extra: &[(&str, &str)], job_limit: Duration) -> Vec<ExitStatus> {
    let wait = WAIT_BOUND_S.to_string();
    let mut env = vec![
        ("SYMMETRIC_MEMORY_HEAP_SIZE", "8M"),
        ("SYMMETRIC_MEMORY_TIMEOUT", &wait),
        ("SYMM_COLL_WORKSPACE", "256K"),
    ];
    env.extend_from_slice(extra);
    let args = [mode.to_string(), victim.to_string(), DETECT_LIMIT_MS.to_string()];
    // Grace well below the wait bound: ranks that hang are killed and reported as such.
    let job = debris::run_job(mode, ranks, exe(), &args, &env, Duration::from_secs(15));
    let took = job.took;
    assert!(took < job_limit, "{mode}: the job took {took:?} (limit {job_limit:?}, wait bound {WAIT_BOUND_S} s)");
    job.statuses
}

fn assert_all_ok(mode: &str, statuses: &[ExitStatus], except: Option<usize>) {
    for (r, st) in statuses.iter().enumerate().filter(|&(r, _)| Some(r) != except) {
        assert!(st.success(), "{mode}: rank {r} ended with {st} (see its CHECK FAILED lines above)");
    }
}

/// Runs a job of `mode` (20 s at most) in which every rank, the victim included, must pass its
/// checks.
fn run_job_all_ok(mode: &str, ranks: usize, victim: usize, extra: &[(&str, &str)]) {
    let statuses = run_job(mode, ranks, victim, extra, Duration::from_secs(20));
    assert_all_ok(&format!("{mode} {extra:?}"), &statuses, None);
}

#[test]
fn a_rank_killed_mid_allreduce_is_named_by_peer_lost_within_two_seconds() {
    for ranks in [3, 4] {
        let victim = ranks - 2;
        let statuses = run_job("kill", ranks, victim, &[], Duration::from_secs(20));
        assert_eq!(statuses[victim].signal(), Some(libc::SIGKILL), "the victim ended with {}", statuses[victim]);
        assert_all_ok("kill", &statuses, Some(victim));
    }
}

#[test]
fn a_rank_that_drops_its_communicator_is_named_by_peer_exited() {
    run_job_all_ok("drop", 3, 1, &[]);
}

#[test]
fn a_rank_that_exits_with_its_communicator_open_is_named_by_peer_exited() {
    run_job_all_ok("exit", 3, 2, &[]);
}

#[test]
fn a_rank_that_returns_from_main_is_named_by_peer_exited() {
    run_job_all_ok("return", 3, 0, &[]);
}

#[test]
fn a_rank_that_never_arrives_gives_a_timeout_naming_op_group_sequence_and_rank_with_the_flight_recorder() {
    run_job_all_ok("timeout", 3, 2, &[]);
}

#[test]
fn ranks_out_of_step_fail_on_every_rank_under_validation() {
    run_job_all_ok("skew", 3, 1, &[("SYMM_VALIDATE", "1")]);
}

#[test]
fn alltoall_sizes_that_disagree_fail_on_every_rank_under_validation_and_on_the_receiver_without() {
    run_job_all_ok("alltoall", 4, 1, &[("SYMM_VALIDATE", "1")]);
    run_job_all_ok("alltoall", 4, 1, &[]);
}

#[test]
fn a_second_start_up_in_the_same_processes_meets_at_the_launchers_store_anew() {
    // spawn_ranks serves one store for the whole job: the second start-up must not read the
    // first one's keys, even when one rank comes late.
    run_job_all_ok("restart", 3, 0, &[]);
}

/// `symm-dfx-rank signal` as the only rank of a world, meeting at `rendezvous` (a store hosted
/// elsewhere when `hosted` is 1).
fn single_rank(rendezvous: &str, hosted: &str) -> Command {
    let mut command = Command::new(exe());
    command
        .args(["signal", "0", "0"])
        .env(symm_registry::RANK_VAR, "0")
        .env(symm_registry::WORLD_SIZE_VAR, "1")
        .env(symm_registry::RENDEZVOUS_VAR, rendezvous)
        .env(symm_registry::RENDEZVOUS_HOSTED_VAR, hosted)
        .env("SYMMETRIC_MEMORY_HEAP_SIZE", "4M");
    command
}

#[test]
fn a_bad_rendezvous_hosted_value_is_a_start_up_error_naming_it() {
    let output = single_rank("127.0.0.1:1", "yes").output().expect("starting symm-dfx-rank");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(2), "expected a start-up failure: {text}");
    for needle in ["start-up failed", "SYMM_RENDEZVOUS_HOSTED", "yes", "expected 1"] {
        assert!(text.contains(needle), "output lacks {needle:?}: {text}");
    }
}

#[test]
fn sigusr1_prints_the_flight_recorder_when_asked_for() {
    let store = symm_registry::store::TcpStoreServer::bind("127.0.0.1:0").expect("serving the start-up store");
    let mut child = single_rank(&store.local_addr().to_string(), "1")
        .env("SYMM_DUMP_ON_SIGNAL", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting symm-dfx-rank");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("reading the rank's first line");
    assert_eq!(line.trim(), "ready", "unexpected first line of the rank");
    // SAFETY: sends SIGUSR1 to the child this test started (and still owns: not reaped yet).
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGUSR1) };
    assert_eq!(rc, 0, "kill(SIGUSR1) failed");
    let status = child.wait().expect("waiting for the rank");
    let mut err = String::new();
    child.stderr.take().expect("stderr").read_to_string(&mut err).expect("reading stderr");
    assert!(status.success(), "the rank ended with {status}; stderr: {err}");
    for needle in ["dump requested by signal", "symm flight recorder", "rank 0 (pid", "init", "completed"] {
        assert!(err.contains(needle), "stderr lacks {needle:?}: {err}");
    }
}
