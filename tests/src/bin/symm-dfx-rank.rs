//! One rank of the diagnostics tests (`tests/dfx_faults.rs`), started by
//! `symm_registry::spawn_ranks`: `symm-dfx-rank <mode> <victim> <limit-ms>`.
//!
//! Every rank checks what it saw itself and exits 0 when it matches the expectation of its
//! mode, 1 otherwise (printing why on stdout, one line each).
//!
//! Modes (the victim is a global rank; the others are the survivors):
//! - `kill`: every rank runs allreduce in a loop; the victim kills itself with SIGKILL from a
//!   timer thread, at any point of a collective. Survivors expect `PeerLost` naming it within
//!   `limit-ms` of the start of the call that failed.
//! - `drop`, `exit`, `return`: the victim leaves normally after some allreduces (drops its
//!   communicator and lives on for a while / calls `std::process::exit(0)` with it open /
//!   returns from `main`). Survivors expect `PeerExited` naming it within `limit-ms`.
//! - `timeout`: the victim never arrives at the third allreduce (it sleeps); survivors expect
//!   a timeout after 1 s whose text names the op, the group, the sequence number, the missing
//!   rank and the flight recorder, with the node dump attached and logged through the sink.
//! - `skew` (run with `SYMM_VALIDATE=1`): the victim arrives late at the second allreduce;
//!   the others time out in it and call the next one. Every rank expects `Mismatch` naming a
//!   peer and both collective call numbers.
//! - `alltoall` (with or without `SYMM_VALIDATE=1`): rank `victim` sends one element too many
//!   to the next rank. With validation every rank expects `Mismatch` naming the pair and both
//!   sizes; without, only the receiver fails.
//! - `signal`: a single rank that waits for SIGUSR1 (`SYMM_DUMP_ON_SIGNAL=1`) for 2 s after
//!   printing `ready`.
//! - `restart`: every rank runs an allreduce, drops its communicator and starts a second one
//!   from the same environment (the victim 300 ms late), then runs an allreduce on it; every
//!   rank expects both sums right.
//!
//! `victim` and `limit-ms` are ignored by `signal`.

use std::time::{Duration, Instant};

use symm_core::dfx::{self, Level};
use symm_core::{Backend, CollOptions, Collectives, Communicator, Error, LocalMut, LocalRef, Rank, ReduceOp};
use symm_registry::Comm;
use symm_tests::coll_cases::on_reference;
use symm_tests::report::{captured, install_capture, say, Checks};

/// An allreduce of 16 ones over the world; the sum it gave (the world size when right).
fn allreduce(comm: &Comm, timeout: Option<Duration>) -> symm_core::Result<f32> {
    let mut buf = vec![1.0f32; 16];
    let opts = CollOptions { timeout, ..CollOptions::default() };
    comm.allreduce(&comm.world(), LocalMut::from(&mut buf), ReduceOp::Sum, &opts)?;
    Ok(buf[0])
}

fn main() {
    install_capture();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mode, victim, limit) = match args.as_slice() {
        [m, v, l] => match (v.parse::<u32>(), l.parse::<u64>()) {
            (Ok(v), Ok(l)) => (m.clone(), Rank(v), Duration::from_millis(l)),
            _ => usage(&args),
        },
        _ => usage(&args),
    };
    let comm = Comm::from_env().unwrap_or_else(|e| {
        say(format!("start-up failed: {e}"));
        std::process::exit(2)
    });
    let me = comm.rank();
    let c = Checks::new(me);
    match mode.as_str() {
        "kill" | "drop" | "exit" | "return" => leave(comm, c, &mode, victim, limit),
        "timeout" => timeout(comm, c, victim),
        "skew" => skew(comm, c, victim),
        "alltoall" => alltoall(comm, c, victim),
        "restart" => restart(comm, c, victim),
        "signal" => {
            say("ready");
            std::thread::sleep(Duration::from_secs(2));
            drop(comm);
            c.exit()
        }
        _ => usage(&args),
    }
}

/// Mode `restart` (see the module documentation).
fn restart(comm: Comm, mut c: Checks, victim: Rank) -> ! {
    let n = comm.world_size() as f32;
    let first = allreduce(&comm, None);
    c.check(matches!(first, Ok(v) if v == n), || format!("first communicator: {first:?}, expected {n}"));
    drop(comm);
    if c.me == victim {
        std::thread::sleep(Duration::from_millis(300));
    }
    match Comm::from_env() {
        Ok(again) => {
            let second = allreduce(&again, None);
            c.check(matches!(second, Ok(v) if v == n), || format!("second communicator: {second:?}, expected {n}"));
        }
        Err(e) => c.check(false, || format!("second start-up failed: {e}")),
    }
    c.exit()
}

fn usage(args: &[String]) -> ! {
    say(format!(
        "usage: symm-dfx-rank <kill|drop|exit|return|timeout|skew|alltoall|signal|restart> <victim> <limit-ms>; got {args:?}"
    ));
    std::process::exit(2)
}

/// The survivors of `victim` meet in their own group (set up while everyone was there), so
/// that none of them exits while another still diagnoses.
fn survivors_meet(comm: &Comm, c: &mut Checks, group: &symm_core::Group) {
    if group.my_rank().is_some() {
        let r = comm.barrier(group);
        c.check(r.is_ok(), || format!("the survivors' barrier failed: {r:?}"));
    }
}

fn survivors_group(comm: &Comm, victim: Rank) -> symm_core::Group {
    let world = comm.world();
    let others: Vec<usize> = (0..comm.world_size()).filter(|&r| r != victim.index()).collect();
    let g = comm.new_group(&world, &others).expect("survivors' group");
    if g.my_rank().is_some() {
        comm.barrier(&g).expect("first survivors' barrier");
    }
    comm.barrier(&world).expect("world barrier");
    g
}

fn leave(comm: Comm, mut c: Checks, mode: &str, victim: Rank, limit: Duration) -> ! {
    let me = comm.rank();
    let group = survivors_group(&comm, victim);
    for _ in 0..20 {
        allreduce(&comm, None).expect("warm-up allreduce");
    }
    if me == victim {
        match mode {
            "kill" => {
                std::thread::spawn(|| {
                    std::thread::sleep(Duration::from_millis(200));
                    say(format!("[victim] SIGKILL (pid {})", std::process::id()));
                    // SAFETY: sends SIGKILL to this process; it ends at once, wherever it is.
                    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
                });
                loop {
                    let _ = allreduce(&comm, None);
                }
            }
            "drop" => {
                say("[victim] dropping the communicator");
                drop(comm);
                // Alive but gone from the group: only the closed mark tells the peers.
                std::thread::sleep(limit + Duration::from_secs(1));
                std::process::exit(0)
            }
            "exit" => {
                say("[victim] std::process::exit(0) with the communicator open");
                std::process::exit(0)
            }
            _ => {
                say("[victim] returning from main");
                drop(comm);
                std::process::exit(0)
            }
        }
    }
    let expect_lost = mode == "kill";
    let outcome = loop {
        let start = Instant::now();
        if let Err(e) = allreduce(&comm, None) {
            break (e, start.elapsed());
        }
    };
    let (e, took) = outcome;
    say(format!("[rank {me}] {mode}: failed after {:.3} s ({}): {e}", took.as_secs_f64(), e.code()));
    match (&e, expect_lost) {
        (Error::PeerLost { peer, .. }, true) | (Error::PeerExited { peer, .. }, false) => {
            c.check(*peer == victim, || format!("named peer {peer}, expected {victim}"));
        }
        _ => c.check(false, || {
            format!("expected {} naming {victim}, got {e}", if expect_lost { "PeerLost" } else { "PeerExited" })
        }),
    }
    c.check(e.to_string().contains(&format!("peer rank {victim}")), || format!("message does not name the peer: {e}"));
    c.check(took <= limit, || format!("detection took {took:?}, more than {limit:?}"));
    survivors_meet(&comm, &mut c, &group);
    c.exit()
}

fn timeout(comm: Comm, mut c: Checks, victim: Rank) -> ! {
    let me = comm.rank();
    let group = survivors_group(&comm, victim);
    for _ in 0..2 {
        allreduce(&comm, None).expect("warm-up allreduce");
    }
    if me == victim {
        // Never arrives at the third allreduce; stays alive (no PeerLost) until the others
        // have given up.
        std::thread::sleep(Duration::from_secs(4));
        drop(comm);
        c.exit();
    }
    let start = Instant::now();
    let (r, logged) = captured(|| allreduce(&comm, Some(Duration::from_secs(1))));
    let took = start.elapsed();
    let lines: Vec<String> = logged.into_iter().filter(|(l, _)| *l == Level::Error).map(|(_, s)| s).collect();
    match &r {
        Err(Error::Timeout(t)) => {
            let text = t.to_string();
            say(format!("[rank {me}] timeout after {:.3} s: {text}", took.as_secs_f64()));
            let others: Vec<Rank> =
                (0..comm.world_size() as u32).map(Rank).filter(|&r| r != me && r != victim).collect();
            for needle in [
                "allreduce".to_string(),
                "operation #3 of the group".into(),
                format!("in group {:?}", comm.world().ranks()),
                format!("ranks not arrived: [{victim}]"),
                format!("ranks arrived: {others:?}"),
                "flight recorder".into(),
                format!("rank {victim}: allreduce #2 in group"),
                format!("rank {me}: allreduce #3 in group"),
            ] {
                c.check(text.contains(&needle), || format!("the timeout does not say {needle:?}: {text}"));
            }
            c.check(t.sequence == Some(3) && t.pending == vec![victim], || format!("fields: {t:?}"));
            let dump = t.flight_dump.clone().unwrap_or_default();
            for r in 0..comm.world_size() {
                c.check(dump.contains(&format!("rank {r} (pid")), || format!("the dump lacks rank {r}: {dump}"));
            }
            c.check(dump.contains("started"), || format!("the dump shows no running operation: {dump}"));
            c.check(
                lines.iter().any(|l| {
                    l.contains("flight recorder at the timeout") && l.contains(&format!("rank {victim} (pid"))
                }),
                || format!("the dump was not logged at error level; got {lines:?}"),
            );
            c.check(lines.iter().any(|l| l.contains("allreduce #3") && l.contains("SYMM_E_TIMEOUT")), || {
                format!("the failure was not logged at error level; got {lines:?}")
            });
        }
        other => c.check(false, || format!("expected a timeout, got {other:?}")),
    }
    c.check(took >= Duration::from_millis(900) && took < Duration::from_secs(3), || {
        format!("waited {took:?}, expected about 1 s")
    });
    survivors_meet(&comm, &mut c, &group);
    c.exit()
}

fn skew(comm: Comm, mut c: Checks, late: Rank) -> ! {
    let me = comm.rank();
    allreduce(&comm, None).expect("warm-up allreduce");
    let result = if me == late {
        // Arrives at call #2 long after the others gave up on it and moved to call #3.
        std::thread::sleep(Duration::from_millis(1500));
        allreduce(&comm, Some(Duration::from_secs(20)))
    } else {
        let first = allreduce(&comm, Some(Duration::from_millis(300)));
        c.check(matches!(first, Err(Error::Timeout(_))), || format!("call #2 should time out, got {first:?}"));
        allreduce(&comm, Some(Duration::from_secs(20)))
    };
    match &result {
        Err(e @ Error::Mismatch { peer, .. }) => {
            let text = e.to_string();
            say(format!("[rank {me}] {text}"));
            // The late rank is in call #2; the others went on to call #3.
            let needles: [&str; 2] = if me == late {
                ["as collective call #2", "its collective call #3"]
            } else {
                ["validation round of collective call #3", "latest collective call of the group: #2"]
            };
            if me != late {
                c.check(*peer == late, || format!("named peer {peer}, expected the late rank {late}"));
            }
            c.check(text.contains(&format!("global rank {peer}")), || format!("no peer in {text}"));
            for needle in needles {
                c.check(text.contains(needle), || format!("expected {needle:?} (both call numbers) in {text}"));
            }
        }
        other => c.check(false, || format!("expected a mismatch, got {other:?}")),
    }
    let r = comm.barrier(&comm.world());
    c.check(r.is_ok(), || format!("final barrier: {r:?}"));
    c.exit()
}

fn alltoall(comm: Comm, mut c: Checks, sender: Rank) -> ! {
    let me = comm.rank();
    let n = comm.world_size();
    let receiver = Rank((sender.0 + 1) % n as u32);
    // The reference collectives compare every member's counts in their descriptor round, so
    // there every rank fails as under validation; the host engine's receiver alone otherwise.
    let validating = dfx::validate_from_env() || on_reference(&comm);
    let mut send_counts = vec![2usize; n];
    if me == sender {
        send_counts[receiver.index()] = 3;
    }
    let send = vec![me.0 as i32; send_counts.iter().sum()];
    let recv_counts = vec![2usize; n];
    let mut recv = vec![0i32; 3 * n];
    let r = comm.alltoall_single(
        &comm.world(),
        LocalRef::from(&send[..]),
        &send_counts,
        LocalMut::from(&mut recv),
        &recv_counts,
        &CollOptions::default(),
    );
    say(format!("[rank {me}] validation {validating}: {r:?}"));
    if validating || me == receiver {
        match &r {
            Err(e @ Error::Mismatch { peer, .. }) => {
                let text = e.to_string();
                let other = if me == sender { receiver } else { sender };
                c.check(*peer == other, || format!("named {peer}, expected {other}: {text}"));
                c.check(text.contains("3 elements") && text.contains("recv_counts["), || {
                    format!("sizes missing: {text}")
                });
                if validating {
                    c.check(
                        text.contains(&format!("global rank {sender}"))
                            && text.contains(&format!("global rank {receiver}")),
                        || format!("the pair is not named: {text}"),
                    );
                }
            }
            other => c.check(false, || format!("expected a mismatch, got {other:?}")),
        }
    } else {
        c.check(r.is_ok(), || format!("without validation only the receiver fails; got {r:?}"));
    }
    let r = comm.barrier(&comm.world());
    c.check(r.is_ok(), || format!("final barrier: {r:?}"));
    c.exit()
}
