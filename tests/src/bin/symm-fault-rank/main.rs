//! One rank of the killed-rank test (`tests/killed_rank.rs`), started by `symm_registry::spawn_ranks`:
//! `symm-fault-rank <victim> <limit-ms> <barrier|wait_until>`.
//!
//! Every rank starts, allocates in the world and passes a world barrier; then rank `victim`
//! kills itself with SIGKILL (no unwinding, no clean-up: as if the OOM killer took it) while the
//! others block on it: in a second world barrier, or in `wait_until` on a signal only the victim
//! would have set. A survivor must get `Error::PeerLost` naming the victim within `limit-ms`,
//! long before the wait bound (`SYMMETRIC_MEMORY_TIMEOUT`).
//!
//! The exit code says what a survivor saw (see `codes.rs`, which the test shares).

use std::time::{Duration, Instant};

use symm_core::{Backend, CmpOp, Communicator, DType, Error, Rank, SymmetricHeap};
use symm_registry::Comm;
use symm_tests::report::say;

mod codes;

use codes::{DETECTED, NO_ERROR, OTHER_ERROR, SETUP_FAILED, TOO_LATE, WRONG_PEER};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parsed = match args.as_slice() {
        [v, l, m] if m == "barrier" || m == "wait_until" => {
            v.parse::<u32>().ok().zip(l.parse::<u64>().ok()).map(|(v, l)| (v, l, m.as_str()))
        }
        _ => None,
    };
    let Some((victim, limit_ms, mode)) = parsed else {
        eprintln!("usage: symm-fault-rank <victim-rank> <limit-ms> <barrier|wait_until>; got {args:?}");
        std::process::exit(SETUP_FAILED);
    };
    let comm = Comm::from_env().unwrap_or_else(|e| {
        eprintln!("start-up failed: {e}");
        std::process::exit(SETUP_FAILED);
    });
    let me = comm.rank();
    let world = comm.world();
    // The survivors' group is set up (and used once) before the victim dies, so that meeting in
    // it at the end needs nothing from a rank that may already have exited.
    let survivors: Vec<usize> = (0..comm.world_size()).filter(|&r| r != victim as usize).collect();
    let setup = comm.alloc(&world, 4, DType::I64).and_then(|sig| {
        comm.write_local(&sig, 0, &[0i64; 4])?;
        let group = comm.new_group(&world, &survivors)?;
        if group.my_rank().is_some() {
            comm.barrier(&group)?;
        }
        comm.barrier(&world).map(|()| (sig, group))
    });
    let (sig, survivors_group) = setup.unwrap_or_else(|e| {
        eprintln!("[rank {me}] set-up failed: {e}");
        std::process::exit(SETUP_FAILED);
    });

    if me == Rank(victim) {
        say(format!("[rank {me}] killing myself with SIGKILL (pid {})", std::process::id()));
        // SAFETY: raise only sends a signal to this thread; SIGKILL ends the process at once.
        unsafe { libc::raise(libc::SIGKILL) };
        unreachable!("SIGKILL cannot be caught");
    }

    let start = Instant::now();
    // Nobody ever sets the signal: only the victim's death can end this wait before the bound.
    let outcome = match mode {
        "barrier" => comm.barrier(&world),
        _ => comm.wait_until(&sig, 0, CmpOp::Ge, 1, None).map(|_| ()),
    };
    let took = start.elapsed();
    let code = match &outcome {
        Err(Error::PeerLost { peer, .. }) if *peer == Rank(victim) => {
            if took <= Duration::from_millis(limit_ms) {
                DETECTED
            } else {
                TOO_LATE
            }
        }
        Err(Error::PeerLost { .. }) => WRONG_PEER,
        Err(_) => OTHER_ERROR,
        Ok(()) => NO_ERROR,
    };
    match outcome {
        Err(e) => say(format!("[rank {me}] {mode} failed after {:.3} s ({}): {e}", took.as_secs_f64(), e.code())),
        Ok(()) => say(format!("[rank {me}] {mode} completed after {:.3} s", took.as_secs_f64())),
    }
    // The survivors meet in their group before they exit: it still works, and no survivor ends
    // before the others have made their own diagnosis (one that ended first would be a lost peer
    // too).
    if let Err(e) = comm.barrier(&survivors_group) {
        say(format!("[rank {me}] the survivors' barrier {survivors:?} failed: {e}"));
        std::process::exit(OTHER_ERROR);
    }
    std::process::exit(code);
}
