//! One rank of the fork test (`tests/fork.rs`), started by `symm_registry::spawn_ranks`.
//!
//! Rank 0 forks twice after start-up. Each child tries an allreduce, a barrier, an allocation
//! and a group creation with the communicator it inherited: each must fail at once with
//! `Error::Unsupported` naming fork, none may reach the parent's peers. The first child then
//! drops its copy, the second keeps it open; both exit normally (`exit(3)`, so symm's `atexit`
//! hook runs): none of it may mark the parent's rank closed or exited. Meanwhile rank 1 is
//! already in its first allreduce, which a child taking its parent's place would pair with.
//! Then both ranks run two allreduces and a barrier, which must give the right sums with no
//! error.
//!
//! Exit codes: 0 when everything held; see [`FAILED`] and the child codes otherwise.

use symm_core::{Backend, CollOptions, Collectives, Communicator, DType, Error, LocalMut, ReduceOp, SymmetricHeap};
use symm_registry::Comm;
use symm_tests::report::say;

/// A parent-side check failed (wrong sum, an error).
const FAILED: i32 = 40;
/// The child's call was not refused.
const CHILD_CALL_SUCCEEDED: i32 = 41;
/// The child's call failed with another error than `Unsupported` naming fork.
const CHILD_WRONG_ERROR: i32 = 42;

fn child(comm: Comm, drop_it: bool) -> ! {
    let world = comm.world();
    let sig = comm.alloc(&world, 0, DType::I64);
    let mut x = [1.0f64];
    let calls: Vec<(&str, symm_core::Result<()>)> = vec![
        ("allreduce", comm.allreduce(&world, LocalMut::from_slice(&mut x), ReduceOp::Sum, &CollOptions::default())),
        ("barrier", comm.barrier(&world)),
        ("alloc", sig.map(|_| ())),
        ("new_group", comm.new_group(&world, &[0]).map(|_| ())),
    ];
    let mut code = 0;
    for (what, r) in calls {
        match r {
            Err(e @ Error::Unsupported { .. }) if e.to_string().contains("fork()") => {
                say(format!("[child of rank 0] {what} refused: {e}"));
            }
            Err(e) => {
                say(format!("[child of rank 0] {what} failed with another error: {e}"));
                code = CHILD_WRONG_ERROR;
            }
            Ok(()) => {
                say(format!("[child of rank 0] {what} succeeded in a forked child"));
                code = CHILD_CALL_SUCCEEDED;
            }
        }
    }
    if drop_it {
        drop(comm);
    } else {
        // Left open for the exit hook to find.
        std::mem::forget(comm);
    }
    // SAFETY: exit(3) runs the atexit handlers (symm's among them) and ends the process.
    unsafe { libc::exit(code) }
}

fn main() {
    let comm = Comm::from_env().unwrap_or_else(|e| {
        eprintln!("start-up failed: {e}");
        std::process::exit(FAILED);
    });
    let me = comm.rank();
    let world = comm.world();
    if me.0 == 0 {
        for drop_it in [true, false] {
            // SAFETY: the child only calls into symm (which refuses) and exits; the test's rank
            // binary has no other threads holding locks the child needs.
            let pid = unsafe { libc::fork() };
            if pid < 0 {
                eprintln!("fork failed: {}", std::io::Error::last_os_error());
                std::process::exit(FAILED);
            }
            if pid == 0 {
                child(comm, drop_it);
            }
            let mut status = 0;
            // SAFETY: waits for the child just created; `status` is writable.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
                say(format!("[rank 0] the forked child (drop: {drop_it}) ended with status {status:#x}"));
                std::process::exit(libc::WEXITSTATUS(status).max(FAILED));
            }
        }
    }
    for call in 1..=2 {
        let mut x = [1.0 + f64::from(me.0)];
        match comm.allreduce(&world, LocalMut::from_slice(&mut x), ReduceOp::Sum, &CollOptions::default()) {
            Ok(()) if x[0] == 3.0 => {}
            Ok(()) => {
                say(format!("[rank {me}] allreduce #{call} returned {} instead of 3", x[0]));
                std::process::exit(FAILED);
            }
            Err(e) => {
                say(format!("[rank {me}] allreduce #{call} failed: {e}"));
                std::process::exit(FAILED);
            }
        }
    }
    if let Err(e) = comm.barrier(&world) {
        say(format!("[rank {me}] the final barrier failed: {e}"));
        std::process::exit(FAILED);
    }
    say(format!("[rank {me}] both allreduces gave 3 after the fork"));
}
