//! One rank of the protocol-disagreement tests (`tests/protocol_faults.rs`), started by
//! `symm_registry::spawn_ranks`: `symm-protocol-rank <mode> <limit-ms>`.
//!
//! Every rank checks what it saw itself and exits 0 when it matches the expectation of its
//! mode, 1 otherwise (printing why on stdout, one line each). Every error must come within
//! `limit-ms` of the start of the call that raised it, far below the job's wait bound
//! (`SYMMETRIC_MEMORY_TIMEOUT`).
//!
//! Modes (broadcasts of 4 f32, which take the small-broadcast path: the root does not wait):
//! - `roots`: every rank names a root for one broadcast: rank r names r when r is the last rank
//!   or `SYMM_PROTOCOL_ROOTS=self`, else 0 (2 ranks: each names itself; 3 ranks: ranks 0 and 1
//!   name 0, rank 2 names itself). Then every rank runs an allreduce. Every rank expects a
//!   `Mismatch` naming a peer that named another root, in the broadcast or, at the latest, in
//!   the allreduce (a root does not wait for its members, so it may learn it only there); under
//!   `SYMM_VALIDATE=1` every rank expects it in the broadcast itself.
//! - `other-call`: rank 0 broadcasts from root 0 while the others run an allreduce, then rank 0
//!   runs an allreduce once the others' limit has passed. The others expect `Mismatch` naming rank 0 and its broadcast in their
//!   allreduce, rank 0 expects `Mismatch` in its broadcast or in its allreduce.
//! - `late-order`: rank 0 broadcasts and 100 ms later runs an allreduce; the others run the
//!   allreduce first, then take the broadcast: a root that makes the others' call soon after
//!   (within the grace a waiter gives it) pairs as before: the allreduces fail on every rank
//!   naming the broadcasts made before them, the broadcast delivers, and the group stays
//!   usable (a third, agreeing allreduce gives the right sum).
//! - `gave-up` (2 ranks): rank 0's second allreduce times out after 300 ms (rank 1 is 1 s
//!   late), and rank 0 then makes no call in the group. Rank 1's second allreduce completes
//!   with what rank 0 had sent; rank 1 expects its third to fail with a `Timeout` naming rank 0
//!   and saying that it gave up, within the limit (not at the job's wait bound).
//! - `skip` (run with `SYMM_VALIDATE=1`): rank 0 broadcasts from root 0 and then from root 1;
//!   rank 1 skipped the first and broadcasts from root 1. Every rank expects `Mismatch` in its
//!   first call naming both roots.
//!
//! A rank may instead get the news of a peer that found the disagreement first (`Mismatch`
//! naming that peer: "found the members out of step"), within the same limit.
//!
//! Every rank ends with a barrier (the backend's, outside the collectives' rounds), which must
//! succeed: nobody is left waiting for the timeout.

use std::time::{Duration, Instant};

use symm_core::{Backend, CollOptions, Collectives, Communicator, Error, LocalMut, Rank, ReduceOp};
use symm_registry::Comm;
use symm_tests::report::{say, Checks};

/// What the news of a peer that found the members out of step says.
const OUT_OF_STEP: &str = "found the members out of step";

/// The checks of a rank whose calls must also end within `limit`.
struct Timed {
    checks: Checks,
    limit: Duration,
}

impl std::ops::Deref for Timed {
    type Target = Checks;
    fn deref(&self) -> &Checks {
        &self.checks
    }
}

impl std::ops::DerefMut for Timed {
    fn deref_mut(&mut self) -> &mut Checks {
        &mut self.checks
    }
}

impl Timed {
    /// Runs `f`, checking that it ends within the limit; its result.
    fn timed<T>(&mut self, what: &str, f: impl FnOnce() -> symm_core::Result<T>) -> symm_core::Result<T> {
        let start = Instant::now();
        let r = f();
        let took = start.elapsed();
        let shown = match &r {
            Ok(_) => "ok".to_string(),
            Err(e) => e.to_string(),
        };
        say(format!("[rank {}] {what} after {took:?}: {shown}", self.me));
        let limit = self.limit;
        self.check(took < limit, || format!("{what} took {took:?} (limit {limit:?})"));
        r
    }

    /// Checks that `r` is a `Mismatch` naming a peer among `peers` whose text holds `needles`,
    /// or the news of any peer that it found the members out of step (what a member learns
    /// from a peer that found the disagreement first).
    fn mismatch<T: std::fmt::Debug>(&mut self, what: &str, r: &symm_core::Result<T>, peers: &[Rank], needles: &[&str]) {
        match r {
            Err(e @ Error::Mismatch { peer, .. }) if e.to_string().contains(OUT_OF_STEP) => {
                let me = self.me;
                self.check(*peer != me, || format!("{what}: named itself: {e}"));
            }
            Err(e @ Error::Mismatch { peer, .. }) => {
                let text = e.to_string();
                self.check(peers.contains(peer), || format!("{what}: named {peer}, expected one of {peers:?}: {text}"));
                for needle in needles {
                    self.check(text.contains(needle), || format!("{what}: expected {needle:?} in {text}"));
                }
            }
            other => self.check(false, || format!("{what}: expected a mismatch, got {other:?}")),
        }
    }

    fn exit(mut self, comm: &Comm) -> ! {
        let r = comm.barrier(&comm.world());
        self.check(r.is_ok(), || format!("final barrier: {r:?}"));
        self.checks.exit()
    }
}

fn broadcast(comm: &Comm, root: usize) -> symm_core::Result<()> {
    let mut buf = vec![comm.rank().0 as f32; 4];
    comm.broadcast(&comm.world(), LocalMut::from(&mut buf), root, &CollOptions::default())
}

fn allreduce(comm: &Comm) -> symm_core::Result<()> {
    let mut buf = vec![1.0f32; 16];
    comm.allreduce(&comm.world(), LocalMut::from(&mut buf), ReduceOp::Sum, &CollOptions::default())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mode, limit) = match args.as_slice() {
        [m, l] => match l.parse::<u64>() {
            Ok(l) => (m.clone(), Duration::from_millis(l)),
            Err(_) => usage(&args),
        },
        _ => usage(&args),
    };
    let comm = Comm::from_env().unwrap_or_else(|e| {
        say(format!("start-up failed: {e}"));
        std::process::exit(2)
    });
    let me = comm.rank();
    let c = Timed { checks: Checks::new(me), limit };
    match mode.as_str() {
        "roots" => roots(comm, c),
        "other-call" => other_call(comm, c),
        "skip" => skip(comm, c),
        "late-order" => late_order(comm, c),
        "gave-up" => gave_up(comm, c),
        _ => usage(&args),
    }
}

fn usage(args: &[String]) -> ! {
    say(format!("usage: symm-protocol-rank <roots|other-call|late-order|gave-up|skip> <limit-ms> (got {args:?})"));
    std::process::exit(2)
}

/// Mode `roots` (see the module documentation).
fn roots(comm: Comm, mut c: Timed) -> ! {
    let (me, n) = (comm.rank().index(), comm.world_size());
    let everyone_self = std::env::var("SYMM_PROTOCOL_ROOTS").as_deref() == Ok("self");
    let root_of = |r: usize| if everyone_self || r == n - 1 { r } else { 0 };
    let mine = root_of(me);
    // The peers that named another root than this rank: the ones a mismatch may name.
    let others: Vec<Rank> = (0..n).filter(|&r| root_of(r) != mine).map(|r| Rank(r as u32)).collect();
    let validating = symm_core::dfx::validate_from_env();
    let b = c.timed("broadcast", || broadcast(&comm, mine));
    if validating {
        c.mismatch("broadcast", &b, &others, &["root="]);
    } else if b.is_ok() {
        let a = c.timed("allreduce", || allreduce(&comm));
        c.mismatch("allreduce after the broadcast", &a, &others, &["root="]);
    } else {
        c.mismatch("broadcast", &b, &others, &["root="]);
    }
    c.exit(&comm)
}

/// Mode `other-call` (see the module documentation).
fn other_call(comm: Comm, mut c: Timed) -> ! {
    let me = comm.rank();
    if me == Rank(0) {
        let others: Vec<Rank> = (1..comm.world_size() as u32).map(Rank).collect();
        let b = c.timed("broadcast", || broadcast(&comm, 0));
        if b.is_ok() {
            // Later than the others' limit: they must find out without this rank's next call.
            std::thread::sleep(c.limit + Duration::from_millis(500));
            let a = c.timed("allreduce", || allreduce(&comm));
            c.mismatch("allreduce after the broadcast", &a, &others, &[]);
        } else {
            c.mismatch("broadcast", &b, &others, &[]);
        }
    } else {
        let a = c.timed("allreduce", || allreduce(&comm));
        c.mismatch("allreduce", &a, &[Rank(0)], &["broadcast(count=4", "root=0", "allreduce"]);
    }
    c.exit(&comm)
}

/// Mode `late-order` (see the module documentation).
fn late_order(comm: Comm, mut c: Timed) -> ! {
    let me = comm.rank();
    let mut data = vec![if me == Rank(0) { 5.0f32 } else { 0.0 }; 4];
    let mut bcast = |c: &mut Timed| {
        c.timed("broadcast", || comm.broadcast(&comm.world(), LocalMut::from(&mut data), 0, &CollOptions::default()))
    };
    let (b, a) = if me == Rank(0) {
        let b = bcast(&mut c);
        std::thread::sleep(Duration::from_millis(100));
        (b, c.timed("allreduce", || allreduce(&comm)))
    } else {
        let a = c.timed("allreduce", || allreduce(&comm));
        (bcast(&mut c), a)
    };
    c.check(b.is_ok(), || format!("the broadcast itself agrees: {b:?}"));
    c.check(data == vec![5.0f32; 4], || format!("broadcast data: {data:?}"));
    let peers: Vec<Rank> = (0..comm.world_size() as u32).map(Rank).filter(|&r| r != me).collect();
    c.mismatch("allreduce", &a, &peers, &["small broadcasts"]);
    let mut buf = vec![1.0f32; 16];
    let r = comm.allreduce(&comm.world(), LocalMut::from(&mut buf), ReduceOp::Sum, &CollOptions::default());
    let n = comm.world_size() as f32;
    c.check(r.is_ok() && buf[0] == n, || format!("the group is usable afterwards: {r:?}, {}", buf[0]));
    c.exit(&comm)
}

/// Mode `gave-up` (see the module documentation).
fn gave_up(comm: Comm, mut c: Timed) -> ! {
    let me = comm.rank();
    let first = allreduce(&comm);
    c.check(first.is_ok(), || format!("first allreduce: {first:?}"));
    let mut buf = vec![1.0f32; 16];
    if me == Rank(0) {
        let opts = CollOptions { timeout: Some(Duration::from_millis(300)), ..CollOptions::default() };
        let r = comm.allreduce(&comm.world(), LocalMut::from(&mut buf), ReduceOp::Sum, &opts);
        c.check(matches!(r, Err(Error::Timeout(_))), || format!("the second allreduce should time out: {r:?}"));
        // No more calls in the group until rank 1 has had its limit.
        std::thread::sleep(c.limit + Duration::from_millis(1500));
    } else {
        std::thread::sleep(Duration::from_secs(1));
        let r = comm.allreduce(&comm.world(), LocalMut::from(&mut buf), ReduceOp::Sum, &CollOptions::default());
        c.check(r.is_ok() && buf[0] == 2.0, || format!("the late call completes with what rank 0 had sent: {r:?}"));
        let r = c.timed("third allreduce", || {
            comm.allreduce(&comm.world(), LocalMut::from(&mut buf), ReduceOp::Sum, &CollOptions::default())
        });
        match &r {
            Err(e @ Error::Timeout(t)) => {
                let text = e.to_string();
                c.check(t.pending == vec![Rank(0)], || format!("pending {:?}, expected [0]: {text}", t.pending));
                c.check(text.contains("global rank 0") && text.contains("gave up"), || {
                    format!("no rank 0 or \"gave up\" in {text}")
                });
            }
            other => c.check(false, || format!("expected a timeout naming rank 0, got {other:?}")),
        }
    }
    c.exit(&comm)
}

/// Mode `skip` (see the module documentation).
fn skip(comm: Comm, mut c: Timed) -> ! {
    let me = comm.rank();
    let peer = Rank(1 - me.0);
    let first = if me == Rank(0) { 0 } else { 1 };
    let b = c.timed("first broadcast", || broadcast(&comm, first));
    c.mismatch("first broadcast", &b, &[peer], &["root=0", "root=1", "collective call #1"]);
    c.exit(&comm)
}
